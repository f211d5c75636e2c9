"""The fast engine on the embedded SmolLM2 (continued from test_llm_engine.py, whose fixtures it
shares; a file of its own so the two run side by side under pytest-xdist): a draft model's
speculation and guided tool calls, exact against greedy and transformers."""

import asyncio

import torch

from tests.conftest import transformers_guided_picks
from tests.engine.test_llm_engine import (  # noqa: F401
    PROMPTS,
    SYSTEM,
    _collect,
    engines,
    generate,
    model_dir,
    parts,
    reqs,
    tokens_of,
)
from voicert.core.chat import ChatMessage
from voicert.core.llm import GenerationRequest
from voicert.engine.clients.llm_engine import LLMEngine
from voicert.engine.settings import EngineConfig


async def test_draft_model_speculation_equals_greedy(model_dir, parts, engines):
    """Draft = the target itself (drafts nearly always accepted) and draft = random weights of the
    same vocabulary and width, two layers deep (drafts nearly never accepted): both must give the
    target's greedy tokens."""
    from voicert.bench.shapes import shape_config
    from voicert.engine.models.llama import LlamaConfig, random_llama

    model, tok = parts
    plain, _ = engines
    texts = [*PROMPTS[:3], "Confirm back to me: my name is Anna Smith."]
    greedy = [tokens_of(ev) for ev in await generate(plain, reqs("dg", texts, 16))]
    junk = random_llama(
        LlamaConfig.from_hf(dict(shape_config("smollm2-random"), num_hidden_layers=2)),
        torch.float32,
        "cpu",
    )
    for name, draft in (("self", model), ("junk", junk)):
        # eager, not traced: what is tested is the draft path (traced == eager: test_runner.py)
        eng = LLMEngine(
            model_dir,
            EngineConfig(kv_memory_gb=0.25, spec_tokens=3, spec_policy="always", torchscript=False),
            model=model,
            tokenizer=tok,
            draft=draft,
        )
        try:
            out = [tokens_of(ev) for ev in await generate(eng, reqs(f"d{name}", texts, 16))]
            spec = eng.core.scheduler.spec
            assert out == greedy, name
            assert spec.proposed > 0
            if name == "self":
                assert spec.acceptance_rate > 0.9 and spec.mean_accepted_length > 3
            else:
                assert spec.acceptance_rate < 0.2
            assert not eng.core.drafter.state  # every finished sequence released its draft blocks
        finally:
            eng.close()


async def test_guided_tool_calls_equal_transformers_with_and_without_speculation(
    model_dir, engines
):
    """A tool call decoded under its schema's masks: the fast engine (plain, and with speculation,
    which guided rows skip) gives exactly the transformers engine's tokens under the same masks
    (checked teacher-forced, one forward a reply, and token at a time on the start of one)."""
    from voicert.config import LlmConfig
    from voicert.core.chat import ToolChoice, ToolChoiceMode, ToolSpec
    from voicert.engine.clients.simple import SimpleEngine

    book = ToolSpec.of(
        "book_table",
        "Book a table at the restaurant",
        {
            "type": "object",
            "required": ["people", "time"],
            "additionalProperties": False,
            "properties": {
                "people": {"type": "integer", "minimum": 1, "maximum": 20},
                "time": {"type": "string", "maxLength": 16},
            },
        },
    )
    hours = ToolSpec.of(
        "opening_hours",
        "When the restaurant is open",
        {"type": "object", "properties": {"day": {"type": "string"}}},
    )
    choices = [
        ToolChoice(ToolChoiceMode.REQUIRED),
        ToolChoice(ToolChoiceMode.NAMED, "book_table"),
        ToolChoice(),
    ]
    asks = [
        "Book a table for four people at 7:30 tonight please",
        "A table for two at eight.",
        "When are you open on Sunday?",
    ]

    def requests(tag):
        return [
            GenerationRequest(
                f"{tag}{i}",
                [SYSTEM, ChatMessage("user", a)],
                48,
                tools=(hours, book),
                tool_choice=c,
            )
            for i, (a, c) in enumerate(zip(asks, choices))
        ]

    async def tokens_of(engine, request):
        return [
            e.token_id for e in await _collect(engine.submit(request)) if e.finish_reason is None
        ]

    async def tokens(engine, tag):
        return list(await asyncio.gather(*[tokens_of(engine, r) for r in requests(tag)]))

    plain, spec = engines
    ref = await tokens(plain, "plain")
    ref_engine = SimpleEngine(model_dir, LlmConfig(engine="simple"))
    try:
        for request, ours in zip(requests("ref"), ref):
            picks = transformers_guided_picks(ref_engine, request, ours)
            assert picks[:-1] == ours, (request.request_id, picks, ours)
            assert (
                picks[-1] is None
                or picks[-1] in ref_engine.stop_ids
                or len(ours) == request.max_new_tokens
            )  # and the reply ends where it ended
        # the transformers engine's own token-at-a-time loop, on the start of one call
        start = requests("simple")[1]
        start.max_new_tokens = 12
        assert (await tokens_of(ref_engine, start)) == ref[1][:12]
    finally:
        ref_engine.close()
    assert await tokens(spec, "spec") == ref
    tok = plain.core.tokenizer
    assert tok.decode(ref[0]).startswith('<tool_call>\n{"name": ')
