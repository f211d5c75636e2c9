"""The fast engine on the embedded SmolLM2, fp32 on the CPU: exact against transformers and itself."""

import asyncio

import pytest
import torch

from tests.conftest import transformers_next_tokens
from voicert.config import cache_dir, load_config
from voicert.core.chat import ChatMessage, ToolSpec
from voicert.core.llm import GenerationRequest
from voicert.engine.clients.llm_engine import LLMEngine
from voicert.engine.core.guided import GuideError
from voicert.engine.core.kv_cache import BlockManager
from voicert.engine.core.prompt import build_prompt
from voicert.engine.core.runner import ModelRunner
from voicert.engine.core.scheduler import Scheduler, SchedulerConfig
from voicert.engine.core.sequence import Sequence
from voicert.engine.core.spec_policy import SpecPolicy
from voicert.engine.loader import resolve_llm
from voicert.engine.models.llama import load_llama
from voicert.engine.settings import EngineConfig

SYSTEM = ChatMessage("system", "You are a helpful voice assistant. Answer in one short sentence.")
PROMPTS = [
    "What is the capital of France?",
    "Say hello.",
    "Name three colors.",
    "What is two plus two?",
    "Repeat after me: the blue car is parked outside.",
    "What day comes after Monday?",
    "Please confirm: a table for four at seven tonight.",
    "Tell me a fun fact about cats.",
    "How do I boil an egg?",
    "Spell the word voice.",
]


@pytest.fixture(scope="module")
def model_dir():
    cfg = load_config(environ={})
    return str(resolve_llm("embedded", cache_dir(cfg.models)))


@pytest.fixture(scope="module")
def parts(model_dir):
    from transformers import AutoTokenizer

    return load_llama(model_dir), AutoTokenizer.from_pretrained(model_dir)


@pytest.fixture(scope="module")
def engines(model_dir, parts):
    model, tok = parts
    # the served CPU path: the forward as a TorchScript trace (bit-identical to eager; test_runner)
    plain = LLMEngine(
        model_dir, EngineConfig(kv_memory_gb=0.25, torchscript=True), model=model, tokenizer=tok
    )
    spec = LLMEngine(
        model_dir,
        EngineConfig(kv_memory_gb=0.25, spec_tokens=4, torchscript=True, spec_policy="always"),
        model=model,
        tokenizer=tok,
    )
    yield plain, spec
    plain.close()
    spec.close()


def prompt_ids(tok, text):
    return build_prompt(tok, [SYSTEM, ChatMessage("user", text)], 2048)


def test_greedy_equals_transformers_5_prompts_x_40_tokens_batched(model_dir, parts):
    """Five prompts of different lengths decode together (one padded batch), 40 tokens each, stop
    tokens ignored."""
    from transformers import AutoModelForCausalLM

    model, tok = parts
    sched = Scheduler(BlockManager(256, 16), SchedulerConfig(), stop_ids=set())
    runner = ModelRunner(model, 256, 16, torchscript=True)  # as served on the CPU
    prompts = PROMPTS[::2]
    seqs = [
        Sequence(GenerationRequest(str(i), [], 40), prompt_ids(tok, t))
        for i, t in enumerate(prompts)
    ]
    for s in seqs:
        sched.add(s)
    while sched.has_work():
        step, _ = sched.schedule()
        sched.postprocess(step, runner.run(step))
    ref_model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    for s, text in zip(seqs, prompts):  # EOS is just another token here, as in ours
        ours = s.tokens[len(s.prompt) :]
        assert len(ours) == 40
        assert transformers_next_tokens(ref_model, s.prompt, ours)[:-1] == ours, text


async def generate(engine, requests):
    async def one(req):
        return [e async for e in engine.submit(req)]

    return await asyncio.gather(*(one(r) for r in requests))


def reqs(tag, texts, max_new=48, history=()):
    return [
        GenerationRequest(f"{tag}-{i}", [SYSTEM, *history, ChatMessage("user", t)], max_new)
        for i, t in enumerate(texts)
    ]


def tokens_of(events):
    return [e.token_id for e in events if e.finish_reason is None]


async def test_cached_equals_uncached_and_history_prefix_is_reused(engines):
    plain, _ = engines
    hits_before = plain.core.blocks.stats.hits
    cold = [tokens_of(ev) for ev in await generate(plain, reqs("cold", PROMPTS[:4]))]
    warm = [tokens_of(ev) for ev in await generate(plain, reqs("warm", PROMPTS[:4]))]
    assert warm == cold
    assert plain.core.blocks.stats.hits > hits_before
    # a second turn: the whole first turn (system + question + reply) is already cached
    first = (await generate(plain, reqs("t1", ["What is the capital of France?"])))[0]
    reply = "".join(e.text for e in first)
    history = (
        ChatMessage("user", "What is the capital of France?"),
        ChatMessage("assistant", reply.strip()),
    )
    hits = plain.core.blocks.stats.hits
    second = (await generate(plain, reqs("t2", ["And what about Germany?"], history=history)))[0]
    reused = plain.core.blocks.stats.hits - hits
    assert reused >= second[-1].prompt_tokens - 2 * plain.cfg.block_size - 12
    assert "Berlin" in "".join(e.text for e in second)


async def test_batched_equals_one_at_a_time(engines):
    plain, _ = engines
    alone = [tokens_of((await generate(plain, [r]))[0]) for r in reqs("solo", PROMPTS[4:8])]
    together = [tokens_of(ev) for ev in await generate(plain, reqs("batch", PROMPTS[4:8]))]
    assert together == alone


class Flipping(SpecPolicy):
    """Speculates on two decode steps of three, whatever the timings (a policy that changes its
    mind as often as it can)."""

    def drafts(self, batch: int, prompts_waiting: bool = False) -> int:
        return 0 if (self.spec_steps + self.plain_steps) % 3 == 2 else self.k


async def test_ngram_speculation_equals_greedy_with_batching(engines):
    """Drafts on two decode steps of three (the policy may switch them per step): greedy tokens."""
    plain, spec = engines
    texts = [*PROMPTS[4:7], "Confirm back to me: my name is Anna Smith and my number is 555 0199."]
    greedy = [tokens_of(ev) for ev in await generate(plain, reqs("g", texts, 64))]
    before, always = spec.core.scheduler.spec.accepted, spec.core.scheduler.policy
    spec.core.scheduler.policy = policy = Flipping(4)
    try:
        fast = [tokens_of(ev) for ev in await generate(spec, reqs("s", texts, 64))]
    finally:
        spec.core.scheduler.policy = always
    assert fast == greedy
    assert spec.core.scheduler.spec.accepted > before  # it did speculate, and kept some drafts
    assert policy.spec_steps > 0 and policy.plain_steps > 0


async def test_stream_events_are_ordered_and_text_matches(engines):
    plain, _ = engines
    ev = (await generate(plain, reqs("txt", ["What is the capital of France?"])))[0]
    toks = tokens_of(ev)
    assert [e.index for e in ev[:-1]] == list(range(len(toks)))
    assert "".join(e.text for e in ev) == plain.tokenizer.decode(toks, skip_special_tokens=True)
    assert ev[-1].finish_reason == "stop" and ev[0].sampled_ns >= ev[0].prefill_start_ns > 0


async def test_cancel_frees_the_sequence_and_its_blocks(engines):
    plain, _ = engines
    free_before = plain.core.blocks.available
    req = GenerationRequest(
        "cancel-me",
        [
            ChatMessage("system", "Answer at great length."),
            ChatMessage("user", "Count from one to two hundred."),
        ],
        300,
    )
    seen = []
    async for e in plain.submit(req):
        seen.append(e)
        if len(seen) == 2:
            plain.cancel("cancel-me")
    assert seen[-1].finish_reason == "cancelled" and len(seen) < 10
    assert "cancel-me" not in plain.live_requests()
    assert plain.core.blocks.available == free_before


async def test_draft_heads_speculation_equals_greedy_with_batching(model_dir, parts, engines):
    """The shipped draft heads propose on two decode steps of three (the policy may switch them
    per step); the target's greedy tokens come out, several at a time."""
    from voicert.engine.core.heads import EMBEDDED_HEADS

    assert EMBEDDED_HEADS.is_file()
    model, tok = parts
    plain, _ = engines
    texts = [*PROMPTS[:3], "Repeat my address back to me: 42 Baker Street, London."]
    greedy = [tokens_of(ev) for ev in await generate(plain, reqs("hg", texts, 48))]
    eng = LLMEngine(
        model_dir,
        EngineConfig(kv_memory_gb=0.25, spec_tokens=2, draft_heads="embedded", torchscript=False),
        model=model,
        tokenizer=tok,
    )
    eng.core.scheduler.policy = policy = Flipping(2)  # drafts on some steps, off on others
    try:
        out = [tokens_of(ev) for ev in await generate(eng, reqs("hs", texts, 48))]
        spec = eng.core.scheduler.spec
        assert out == greedy
        assert policy.spec_steps > 0 and policy.plain_steps > 0
        assert (
            spec.accepted > 0.2 * spec.proposed / 2
        )  # they do guess right: > 0.2 drafts a verify row
    finally:
        eng.close()


def test_gpu_options_are_refused_or_off_on_the_cpu(model_dir, parts):
    """A GPU option asked for by name is refused, naming the key; one that means "where the
    device has it" (the server's defaults: kernels, graphs, the engine's own stream) is off."""
    from voicert.config import ConfigError

    for bad, key in (
        (dict(pdl="on"), "llm.pdl"),
        (dict(decode_linear="triton"), "llm.decode_linear"),
        (dict(fp8=True), "llm.fp8"),
        (dict(int4=True), "llm.int4"),
        (dict(kv_cache="int8"), "llm.kv_cache"),
    ):
        with pytest.raises(ConfigError, match=key):
            EngineConfig(**bad)
    model, tok = parts
    eng = LLMEngine(
        model_dir,
        EngineConfig(
            kv_memory_gb=0.05,
            fused_kernels=True,
            cuda_graphs=True,
            own_stream=True,
            torchscript=False,
        ),
        model=model,
        tokenizer=tok,
    )
    try:
        cfg = eng.core.cfg
        assert not (cfg.fused_kernels or cfg.cuda_graphs or cfg.own_stream)
        assert not model.use_kernels and eng.core.runner.graphs is None
    finally:
        eng.close()


async def test_a_request_that_cannot_be_served_fails_alone(engines, parts, monkeypatch):
    plain, _ = engines
    _, _tok = parts
    # wrong types from an untrusted door (a Twilio customParameter that was a number)
    bad = GenerationRequest("bad-types", [ChatMessage("system", 123), ChatMessage("user", "Hi")], 8)
    events = [e async for e in plain.submit(bad)]
    assert [e.finish_reason for e in events] == ["error"] and "bad request" in events[0].error
    # a chat template that raises on the engine thread fails that request, not the engine
    real = plain.core.prompts.build

    def build(messages, budget, tools=None):
        if any("explode" in m.content for m in messages):
            raise ValueError("template exploded")
        return real(messages, budget, tools)

    monkeypatch.setattr(plain.core.prompts, "build", build)
    boom = GenerationRequest("boom", [SYSTEM, ChatMessage("user", "explode")], 8)
    ok = GenerationRequest("fine", [SYSTEM, ChatMessage("user", "Say hello.")], 8, ignore_eos=True)
    a, b = await asyncio.gather(_collect(plain.submit(boom)), _collect(plain.submit(ok)))
    assert a[-1].finish_reason == "error" and "template exploded" in a[-1].error
    assert b[-1].finish_reason == "length" and len(b) == 9
    assert plain.healthy and not plain.live_requests()


async def _collect(stream):
    return [e async for e in stream]


TOOL = ToolSpec.of(
    "book_table",
    "Book a table",
    {"type": "object", "properties": {"people": {"type": "integer"}}, "required": ["people"]},
)


async def test_a_tool_grammar_is_built_off_the_engine_thread_while_others_are_served(
    engines, monkeypatch
):
    """A request with tools waits for its grammar on the grammar thread, not in a step: a plain
    request sent meanwhile is served to its end; one aborted while its grammar is built ends
    cancelled, and one whose grammar is refused ends with a bad-request error."""
    import threading

    plain, _ = engines
    guides = plain.core.guides
    real, release, threads = guides.for_request, threading.Event(), []

    def slow(request):
        threads.append(threading.current_thread().name)
        assert release.wait(30)
        return real(request)

    monkeypatch.setattr(guides, "for_request", slow)
    tools = (TOOL,)
    held = GenerationRequest("held", [SYSTEM, ChatMessage("user", "Book.")], 4, tools=tools)
    held_task = asyncio.ensure_future(_collect(plain.submit(held)))
    other = GenerationRequest("other", [SYSTEM, ChatMessage("user", "Hi.")], 4, ignore_eos=True)
    served = await asyncio.wait_for(_collect(plain.submit(other)), 30)
    assert served[-1].finish_reason == "length" and not held_task.done()
    gone = GenerationRequest("gone", [SYSTEM, ChatMessage("user", "Book.")], 4, tools=tools)
    gone_task = asyncio.ensure_future(_collect(plain.submit(gone)))
    await asyncio.sleep(0)
    plain.cancel("gone")
    release.set()
    held_events, gone_events = await asyncio.wait_for(asyncio.gather(held_task, gone_task), 30)
    assert held_events[-1].finish_reason in ("stop", "length", "tool_calls")
    assert gone_events[-1].finish_reason == "cancelled"
    assert threads and all(name.startswith("voicert-engine-grammar") for name in threads)
    monkeypatch.setattr(guides, "for_request", lambda r: (_ for _ in ()).throw(GuideError("no")))
    refused = GenerationRequest("refused", [SYSTEM, ChatMessage("user", "Book.")], 4, tools=tools)
    events = await asyncio.wait_for(_collect(plain.submit(refused)), 30)
    assert events[-1].finish_reason == "error" and events[-1].error.startswith("bad request")
    assert plain.healthy and not plain.live_requests()
