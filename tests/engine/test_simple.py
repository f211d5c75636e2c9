import asyncio

import pytest

from tests.conftest import transformers_next_tokens
from voicert.core.chat import ChatMessage
from voicert.core.llm import GenerationRequest
from voicert.engine.core.prompt import build_prompt

PROMPTS = [
    "What is the capital of France?",
    "Say hello.",
    "Name three colors.",
    "What is two plus two?",
]
SYSTEM = ChatMessage("system", "You are a helpful voice assistant. Answer in one short sentence.")


@pytest.fixture(scope="module")
def engine(cfg):
    from voicert.config import LlmConfig, cache_dir
    from voicert.engine.clients.simple import SimpleEngine
    from voicert.engine.loader import resolve_llm

    eng = SimpleEngine(
        str(resolve_llm("embedded", cache_dir(cfg.models))), LlmConfig(engine="simple")
    )
    yield eng
    eng.close()


async def collect(engine, request):
    return [ev async for ev in engine.submit(request)]


async def test_greedy_tokens_equal_transformers_generate(engine):
    for i, text in enumerate(PROMPTS):
        msgs = [SYSTEM, ChatMessage("user", text)]
        events = await collect(engine, GenerationRequest(f"eq{i}", msgs, 24))
        ours = [e.token_id for e in events if e.finish_reason is None]
        ids = build_prompt(engine.tokenizer, msgs, 2048)
        ref = transformers_next_tokens(engine.model, ids, ours)
        assert ours == ref[:-1], text
        if events[-1].finish_reason == "stop":  # transformers too would have stopped there
            assert ref[-1] in engine.stop_ids, text
        else:
            assert events[-1].finish_reason == "length" and len(ours) == 24, text
        assert events[-1].prompt_tokens == len(ids)


async def test_streamed_deltas_concatenate_to_the_decoded_reply(engine):
    msgs = [SYSTEM, ChatMessage("user", "What is the capital of France?")]
    events = await collect(engine, GenerationRequest("detok", msgs, 32))
    text = "".join(e.text for e in events)
    ids = [e.token_id for e in events if e.finish_reason is None]
    assert text == engine.tokenizer.decode(ids, skip_special_tokens=True)
    assert "Paris" in text
    assert [e.index for e in events[:-1]] == list(range(len(ids)))


async def test_length_limit_reports_length(engine):
    msgs = [
        ChatMessage("system", "Answer at great length."),
        ChatMessage("user", "Describe the history of Rome in detail."),
    ]
    events = await collect(engine, GenerationRequest("len", msgs, 5))
    assert len(events) == 6 and events[-1].finish_reason == "length"


async def test_cancel_stops_within_a_step_and_frees_the_request(engine):
    msgs = [
        ChatMessage("system", "Answer at great length."),
        ChatMessage("user", "Count from one to two hundred."),
    ]
    before = engine.stats().cancelled
    stream = engine.submit(GenerationRequest("cancel-me", msgs, 300))
    seen = []
    async for ev in stream:
        seen.append(ev)
        if len(seen) == 3:
            engine.cancel("cancel-me")
        if ev.finish_reason:
            break
    assert seen[-1].finish_reason == "cancelled"
    assert len(seen) <= 3 + 2  # at most one step already in flight when cancel landed
    assert "cancel-me" not in engine.live_requests()
    assert engine.stats().cancelled == before + 1


async def test_cancel_while_queued_never_starts(engine):
    long = [ChatMessage("user", "Count from one to fifty.")]
    first = engine.submit(GenerationRequest("busy", long, 20))
    second = engine.submit(GenerationRequest("queued", long, 20))
    engine.cancel("queued")
    a, b = await asyncio.gather(_drain(first), _drain(second))
    assert a[-1].finish_reason in ("stop", "length")
    assert [e.finish_reason for e in b] == ["cancelled"]
    assert not engine.live_requests()


async def _drain(stream):
    return [ev async for ev in stream]


def test_build_prompt_drops_oldest_turns_but_keeps_system_and_last_user(engine):
    history = []
    for i in range(40):
        history += [
            ChatMessage("user", f"question number {i} " * 5),
            ChatMessage("assistant", f"answer number {i} " * 5),
        ]
    msgs = [SYSTEM, *history, ChatMessage("user", "final question")]
    ids = build_prompt(engine.tokenizer, msgs, 300)
    text = engine.tokenizer.decode(ids)
    assert len(ids) <= 300
    assert "voice assistant" in text and "final question" in text
    assert "question number 0 " not in text and "answer number 39" in text
