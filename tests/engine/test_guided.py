"""Grammar-guided decoding in the engine core: a tool call decoded under its schema always parses
and validates, whatever the model wants; rows without a grammar are untouched by the rows with one.

A random SmolLM2-shaped model (2 layers) is the adversary here: its greedy tokens are noise, so the
masks decide nearly every token of a call."""

import json

import jsonschema
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.engine.random_model import random_core
from voicert.agent.tool_calls import CallClosed, CallParser
from voicert.core.chat import ChatMessage, ToolChoice, ToolChoiceMode, ToolSpec
from voicert.core.llm import FinishReason, GenerationRequest
from voicert.engine.core.engine_core import EngineCore
from voicert.engine.core.guided import GuideError

REQUIRED = ToolChoice(ToolChoiceMode.REQUIRED)
BOOK = ToolSpec.of(
    "book_table",
    "Book a table",
    {
        "type": "object",
        "additionalProperties": False,
        "required": ["people", "time"],
        "properties": {
            "people": {"type": "integer", "minimum": 1, "maximum": 12},
            "time": {"type": "string", "enum": ["18:00", "19:30", "21:00"]},
        },
    },
)
CANCEL = ToolSpec.of(
    "cancel",
    "Cancel a booking",
    {
        "type": "object",
        "additionalProperties": False,
        "required": ["booking_id"],
        "properties": {"booking_id": {"type": "string", "pattern": "^B[0-9]{4}$"}},
    },
)


@pytest.fixture(scope="module")
def core():
    return random_core(num_blocks=256)


def _run(core: EngineCore, *requests: GenerationRequest) -> dict[str, tuple[list[int], str]]:
    for r in requests:
        core.add(r)
    toks: dict[str, list[int]] = {r.request_id: [] for r in requests}
    ends: dict[str, str] = {}
    for _ in range(4000):
        if not core.has_work():
            break
        for o in core.step():
            if o.finish_reason is not None:
                ends[o.request_id] = o.finish_reason
            else:
                toks[o.request_id].append(o.token_id)
    assert not core.has_work()
    return {rid: (toks[rid], ends[rid]) for rid in toks}


def _calls(core: EngineCore, ids: list[int]) -> list[CallClosed]:
    parser = CallParser()
    pieces = parser.feed(core.tokenizer.decode(ids)) + parser.close()
    return [p for p in pieces if isinstance(p, CallClosed)]


def _ask(rid: str, tools, choice=REQUIRED, n: int = 200, parallel: bool = False):
    return GenerationRequest(
        rid,
        [ChatMessage("user", "Book me a table for four at half seven")],
        n,
        tools=tuple(tools),
        tool_choice=choice,
        parallel_tool_calls=parallel,
    )


def test_a_required_call_is_one_of_the_tools_with_schema_valid_arguments(core):
    ((ids, end),) = _run(core, _ask("r", [BOOK, CANCEL])).values()
    assert end == FinishReason.STOP  # the grammar ended the reply once the call was complete
    calls = _calls(core, ids)
    assert len(calls) == 1 and calls[0].name in ("book_table", "cancel")
    spec = BOOK if calls[0].name == "book_table" else CANCEL
    jsonschema.validate(json.loads(calls[0].arguments), spec.schema)


def test_a_named_choice_calls_that_tool(core):
    ((ids, end),) = _run(
        core, _ask("n", [BOOK, CANCEL], ToolChoice(ToolChoiceMode.NAMED, "cancel"))
    ).values()
    calls = _calls(core, ids)
    assert end == FinishReason.STOP and [c.name for c in calls] == ["cancel"]
    assert json.loads(calls[0].arguments)["booking_id"][0] == "B"


def test_choice_none_offers_no_tool_and_decodes_as_plain_greedy(core):
    plain = _run(core, GenerationRequest("p", [ChatMessage("user", "Hi")], 12, ignore_eos=True))
    none = _run(
        core,
        GenerationRequest(
            "p",
            [ChatMessage("user", "Hi")],
            12,
            ignore_eos=True,
            tools=(BOOK,),
            tool_choice=ToolChoice(ToolChoiceMode.NONE),
        ),
    )
    assert plain == none


def test_rows_without_a_grammar_are_token_identical_beside_guided_rows(core):
    a = GenerationRequest("a", [ChatMessage("user", "Tell me a story")], 40, ignore_eos=True)
    b = GenerationRequest("b", [ChatMessage("user", "What is the weather?")], 24, ignore_eos=True)
    alone = _run(core, a, b)
    for r in (a, b):
        r.submit_ns = 0
    mixed = _run(core, a, _ask("g1", [BOOK]), b, _ask("g2", [CANCEL, BOOK], parallel=True))
    assert mixed["a"] == alone["a"] and mixed["b"] == alone["b"]
    for rid in ("g1", "g2"):
        assert _calls(core, mixed[rid][0]), rid


def test_an_unusable_schema_fails_that_request_alone(core):
    odd = {"type": "object", "properties": {"x": {"$ref": "#/nope"}}}
    with pytest.raises(ValueError, match="nope"):  # refused where it is declared
        ToolSpec.of("odd", "", odd)
    bad = ToolSpec("odd", "", json.dumps(odd))  # built around that check: the engine's own
    with pytest.raises(GuideError):
        core.add(_ask("bad", [bad]))
    assert not core.has_work()


def test_a_hostile_pattern_fails_its_request_alone_with_a_clear_error(core):
    from voicert.core.llm import is_bad_request

    hostile = {
        "type": "object",
        "properties": {"x": {"type": "string", "pattern": "^((a{100}){100}){100}$"}},
        "required": ["x"],
    }
    outs = []
    core.add(_ask("hostile", [ToolSpec.of("f", "", hostile)]))
    core.add(_ask("plain", [ToolSpec.of("book", "", {"type": "object"})]))
    for _ in range(4000):
        if not core.has_work():
            break
        outs += [o for o in core.step() if o.finish_reason is not None]
    ends = {o.request_id: o for o in outs}
    assert ends["hostile"].finish_reason == "error"
    assert "beyond the engine's limits" in (ends["hostile"].error or "")
    assert is_bad_request(ends["hostile"].error)  # the client's schema, not the engine, failed
    assert ends["plain"].finish_reason in ("stop", "length") and ends["plain"].error is None


# ------------------------------------------------------------------ property: random schemas

_leaf = st.one_of(
    st.builds(
        lambda lo, span: {"type": "integer", "minimum": lo, "maximum": lo + span},
        st.integers(-50, 50),
        st.integers(0, 1000),
    ),
    st.builds(lambda n: {"type": "string", "maxLength": n}, st.integers(0, 12)),
    st.builds(
        lambda vals: {"type": "string", "enum": vals},
        st.lists(st.text("abcxyz ", min_size=1, max_size=6), min_size=1, max_size=4, unique=True),
    ),
    st.just({"type": "boolean"}),
    st.just({"type": "null"}),
)
_value = st.recursive(
    _leaf,
    lambda inner: st.one_of(
        st.builds(
            lambda item, n: {"type": "array", "items": item, "maxItems": n},
            inner,
            st.integers(0, 3),
        ),
        st.builds(
            lambda props: {
                "type": "object",
                "properties": props,
                "required": sorted(props)[: len(props) // 2 + 1] if props else [],
                "additionalProperties": False,
            },
            st.dictionaries(st.from_regex(r"[a-z]{1,6}", fullmatch=True), inner, max_size=3),
        ),
    ),
    max_leaves=6,
)
_schema = st.dictionaries(
    st.from_regex(r"[a-z_]{1,8}", fullmatch=True), _value, min_size=0, max_size=4
).map(
    lambda props: {
        "type": "object",
        "properties": props,
        "required": sorted(props),
        "additionalProperties": False,
    }
)


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(schema=_schema)
def test_a_guided_call_always_validates_against_a_random_schema(core, schema):
    tool = ToolSpec.of("f", "a function", schema)
    ((ids, end),) = _run(core, _ask("h", [tool], n=400)).values()
    assert end == FinishReason.STOP, core.tokenizer.decode(ids)
    calls = _calls(core, ids)
    assert len(calls) == 1 and calls[0].name == "f"
    jsonschema.validate(json.loads(calls[0].arguments), schema)


def test_masks_from_the_thread_pool_equal_masks_computed_one_by_one(core):
    import llguidance

    from voicert.engine.core.guided import PARALLEL_ROWS, masked_argmax

    def guides():
        out = []
        for i in range(PARALLEL_ROWS + 2):
            guide = core.guides.for_request(_ask(f"m{i}", [BOOK, CANCEL]))
            guide.advance(core.tokenizer.encode("<tool_call>", add_special_tokens=False)[0])
            out.append(guide)
        return out

    logits = torch.randn(
        PARALLEL_ROWS + 2, core.model.cfg.vocab_size, generator=torch.Generator().manual_seed(1)
    )
    serial = masked_argmax(guides(), logits)
    pooled = masked_argmax(guides(), logits, llguidance.LLExecutor())
    assert serial == pooled
    allowed = guides()[0]
    assert all(allowed.allows(t) for t in serial)


def test_a_tokenizer_json_llguidance_misreads_is_read_from_the_tokens_bytes(core, monkeypatch):
    """As seen on the GPU machine: a GGUF-converted tokenizer under another transformers version,
    whose JSON llguidance read as plain text ("Ċ" for a newline). The check catches it and the
    tokens' own bytes are used; the masks are the same as from a well-read tokenizer."""
    import json as _json

    import llguidance
    import llguidance.hf

    from voicert.engine.core.guided import Guides, TokenBytes, round_trips

    tok = core.tokenizer
    good = llguidance.hf.from_tokenizer(tok, n_vocab=core.model.cfg.vocab_size)
    spec = _json.loads(tok.backend_tokenizer.to_str())
    # byte-level no more: the pieces are read as text ("Ċ", not a newline)
    spec["decoder"] = {
        "type": "Sequence",
        "decoders": [
            {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
            {"type": "ByteFallback"},
            {"type": "Fuse"},
        ],
    }
    bad = llguidance.LLTokenizer(_json.dumps(spec), n_vocab=core.model.cfg.vocab_size)
    assert round_trips(good, tok) and not round_trips(bad, tok)
    monkeypatch.setattr(llguidance.hf, "from_tokenizer", lambda *a, **k: bad)
    guides = Guides(tok, core.model.cfg.vocab_size, core.guides.call_format)
    fixed = guides._ll_tokenizer()
    assert round_trips(fixed, tok)
    wrapped = TokenBytes(tok, core.model.cfg.vocab_size)
    assert wrapped.tokens[tok.encode("\n", add_special_tokens=False)[0]] == b"\n"
    grammar = llguidance.LLMatcher.grammar_from_lark(core.guides.grammar(_ask("t", [BOOK])))
    a, b = llguidance.LLMatcher(good, grammar), llguidance.LLMatcher(fixed, grammar)
    ids = tok.encode(
        '<tool_call>\n{"name": "book_table", "arguments": {"people": 4, "time": "',
        add_special_tokens=False,
    )
    assert a.validate_tokens(ids) == b.validate_tokens(ids) == len(ids)
    a.consume_tokens(ids)
    b.consume_tokens(ids)
    words = -(-core.model.cfg.vocab_size // 32)
    ma, mb = np.zeros(words, np.int32), np.zeros(words, np.int32)
    a.unsafe_compute_mask_ptr(ma.ctypes.data, words * 4)
    b.unsafe_compute_mask_ptr(mb.ctypes.data, words * 4)
    assert (ma == mb).all()


def test_a_schema_with_defs_and_refs_is_decoded_under_and_its_calls_validate(core):
    """pydantic's and msgspec's schemas of nested types point into themselves ($defs, $ref to
    "#/$defs/..." and "#/properties/..."); nested under a call they used to miss, and every
    reply that offered the tool failed."""
    address = {
        "type": "object",
        "additionalProperties": False,
        "required": ["city"],
        "properties": {"city": {"type": "string", "maxLength": 12}},
    }
    schema = {
        "type": "object",
        "additionalProperties": False,
        "required": ["home", "work"],
        "properties": {"home": {"$ref": "#/$defs/Address"}, "work": {"$ref": "#/properties/home"}},
        "$defs": {"Address": address},
    }
    move = ToolSpec.of("move", "Move house", schema)
    for rid, others in (("one", []), ("two", [CANCEL])):  # alone, and in an anyOf of tools
        choice = ToolChoice(ToolChoiceMode.NAMED, "move")
        ((ids, end),) = _run(core, _ask(rid, [move, *others], choice)).values()
        (call,) = _calls(core, ids)
        assert call.name == "move" and end == FinishReason.STOP
        jsonschema.validate(json.loads(call.arguments), schema)


def test_a_tool_set_is_compiled_once_and_each_request_gets_its_own_state(core):
    """The second request with the same tools copies the cached grammar (no compile); advancing
    one request's guide leaves the other's at the start."""
    from voicert.engine.core.guided import Guides

    guides = Guides(core.tokenizer, core.model.cfg.vocab_size, core.guides.call_format)
    req = GenerationRequest("a", [ChatMessage("user", "Book.")], 8, tools=(BOOK, CANCEL))
    first = guides.for_request(req)
    second = guides.for_request(GenerationRequest("b", req.messages, 8, tools=(BOOK, CANCEL)))
    assert guides.compiles == 1 and first is not None and second is not None
    ids = core.tokenizer.encode("<tool_call>", add_special_tokens=False)
    for t in ids:
        first.advance(t)
    assert first.matcher.deep_copy() is not None
    fresh = guides.for_request(GenerationRequest("c", req.messages, 8, tools=(BOOK, CANCEL)))
    # the copies start where the template does: the first's advance did not move them
    assert [fresh.allows(t) for t in ids[:1]] == [second.allows(t) for t in ids[:1]]
    assert second.matcher.validate_tokens(ids) == len(ids)
    guides.for_request(GenerationRequest("d", req.messages, 8, tools=(BOOK,)))
    assert guides.compiles == 2


def test_a_refused_grammar_is_kept_refused_with_a_one_line_message(core, monkeypatch):
    """llguidance's message quotes the whole grammar on later lines: the refusal keeps its first
    line (cut to ERROR_CHARS), and a client that repeats the tool set costs no second compile."""
    import llguidance

    from voicert.engine.core.guided import ERROR_CHARS, Guides

    guides = Guides(core.tokenizer, core.model.cfg.vocab_size, core.guides.call_format)

    def refuse(lark):
        raise ValueError("grammar too big " + "x" * 1000 + "\n" + lark)

    monkeypatch.setattr(llguidance.LLMatcher, "grammar_from_lark", staticmethod(refuse))
    req = GenerationRequest("a", [ChatMessage("user", "Book.")], 8, tools=(BOOK,))
    for _ in range(2):
        with pytest.raises(GuideError) as err:
            guides.for_request(req)
        message = str(err.value)
        assert "\n" not in message and "book_table" not in message
        assert len(message) <= ERROR_CHARS + len("tool schema not usable: ")
    assert guides.compiles == 1


def test_a_tool_set_over_the_lexer_limits_is_refused_from_then_on(core):
    """The first request under a hostile pattern fails at its first mask; the tool set is then
    refused when the next request's guide is built, before any step runs it."""
    from voicert.engine.core.guided import Guides, masked_argmax

    guides = Guides(core.tokenizer, core.model.cfg.vocab_size, core.guides.call_format)
    hostile = ToolSpec.of(
        "book",
        "",
        {
            "type": "object",
            "properties": {"code": {"type": "string", "pattern": "^((a{100}){100}){100}$"}},
            "required": ["code"],
        },
    )
    req = GenerationRequest("a", [ChatMessage("user", "Book.")], 8, tools=(hostile,))
    guide = guides.for_request(req)
    text = '<tool_call>\n{"name": "book", "arguments": {"code": "aaaa'
    with pytest.raises(GuideError, match="beyond the engine's limits"):
        for token in core.tokenizer.encode(text, add_special_tokens=False):
            masked_argmax([guide], torch.zeros(1, core.model.cfg.vocab_size))  # a refused row's
            guide.advance(token)
    with pytest.raises(GuideError, match="beyond the engine's limits"):
        guides.for_request(GenerationRequest("b", req.messages, 8, tools=(hostile,)))
    assert guides.compiles == 1


def test_the_tokenizer_is_made_at_warm_up_not_by_the_first_request_with_tools(core, monkeypatch):
    """Making llguidance's tokenizer holds the GIL ~0.5 s: at start, not mid-traffic."""
    from voicert.engine.core.guided import Guides

    guides = Guides(core.tokenizer, core.model.cfg.vocab_size, core.guides.call_format)
    made = []
    make = guides._make_ll_tokenizer
    monkeypatch.setattr(guides, "_make_ll_tokenizer", lambda: made.append(1) or make())
    guides.warm()
    assert made == [1]
    assert guides.for_request(_ask("w", [BOOK])) is not None
    assert made == [1]
