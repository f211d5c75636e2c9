"""The fast engine in its own process (llm.process): same tokens as in-process, cancel frees the
request, counters and batch sizes come back, a child that cannot start fails loudly."""

import asyncio

import pytest

from voicert.config import cache_dir, load_config
from voicert.core.chat import ChatMessage
from voicert.core.llm import GenerationRequest
from voicert.engine.clients.llm_engine import LLMEngine
from voicert.engine.clients.remote import EngineProcess
from voicert.engine.loader import resolve_llm
from voicert.engine.settings import EngineConfig

SYSTEM = ChatMessage("system", "You are a helpful voice assistant. Answer in one short sentence.")
QUESTIONS = ["What is the capital of France?", "Name three colors.", "Spell the word voice."]


@pytest.fixture(scope="module")
def model_dir():
    return str(resolve_llm("embedded", cache_dir(load_config(environ={}).models)))


@pytest.fixture(scope="module")
def remote(model_dir):
    engine = EngineProcess(model_dir, EngineConfig(kv_memory_gb=0.25, torchscript=False), threads=1)
    yield engine
    engine.close()


async def collect(engine, rid: str, text: str, n: int = 24):
    request = GenerationRequest(rid, [SYSTEM, ChatMessage("user", text)], n, ignore_eos=True)
    return [ev async for ev in engine.submit(request)]


async def test_same_tokens_as_the_in_process_engine(remote, model_dir):
    local = LLMEngine(model_dir, EngineConfig(kv_memory_gb=0.25, torchscript=False))
    try:
        for i, q in enumerate(QUESTIONS):
            theirs = await collect(remote, f"r{i}", q)
            ours = await collect(local, f"l{i}", q)
            assert [e.token_id for e in theirs] == [e.token_id for e in ours]
            assert "".join(e.text for e in theirs) == "".join(e.text for e in ours)
            assert theirs[-1].finish_reason == "length" and len(theirs) == 25
    finally:
        local.close()
    # several at once share steps in the child, and each still gets its own tokens in order
    together = await asyncio.gather(*(collect(remote, f"t{i}", q) for i, q in enumerate(QUESTIONS)))
    for events in together:
        assert [e.index for e in events[:-1]] == list(range(24))
    stats = remote.stats()
    assert stats.submitted >= 6 and stats.active == 0
    steps = remote.drain_steps()
    assert {r.kind for r in steps} == {"prefill", "decode"} and not remote.live_requests()
    assert all(r.batch >= 1 and r.seconds > 0 for r in steps)
    first = together[0][0]
    assert first.prefill_start_ns <= first.sampled_ns  # the child's clock is the server's clock


async def test_cancel_stops_and_frees(remote):
    request = GenerationRequest(
        "long", [SYSTEM, ChatMessage("user", "Count to one thousand.")], 2000, ignore_eos=True
    )
    stream = remote.submit(request)
    seen = 0
    async for ev in stream:
        if ev.finish_reason is not None:
            break
        seen += 1
        if seen == 3:
            remote.cancel("long")
    assert ev.finish_reason == "cancelled" and seen < 100
    assert "long" not in remote.live_requests()
    assert remote.stats().cancelled >= 1


def test_a_child_that_cannot_load_fails_the_start(tmp_path):
    with pytest.raises(RuntimeError, match="failed to start"):
        EngineProcess(str(tmp_path), EngineConfig(kv_memory_gb=0.1, torchscript=False))
