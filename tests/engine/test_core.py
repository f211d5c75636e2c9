"""The engine core on its own: synchronous add / abort / step, no threads, no event loop; and the
threaded client around it gives the same tokens, detokenised on the caller's side."""

import pytest

from tests.engine.random_model import random_core, random_parts
from voicert.core.chat import ChatMessage
from voicert.core.llm import FinishReason, GenerationRequest
from voicert.engine.clients.llm_engine import LLMEngine
from voicert.engine.core.engine_core import EngineCore
from voicert.engine.settings import EngineConfig


@pytest.fixture(scope="module")
def parts():
    return random_parts()


def _core(parts) -> EngineCore:
    return random_core(parts, num_blocks=64)


def _request(rid: str, text: str, n: int = 12) -> GenerationRequest:
    return GenerationRequest(rid, [ChatMessage("user", text)], n, ignore_eos=True)


def _run(core: EngineCore, limit: int = 200) -> list:
    outs = []
    for _ in range(limit):
        if not core.has_work():
            return outs
        outs.extend(core.step())
    raise AssertionError("the core did not finish")


def test_a_core_steps_requests_to_their_final_records_and_frees_everything(parts):
    core = _core(parts)
    free = core.blocks.available
    core.add(_request("a", "Hello there"))
    core.add(_request("b", "What time is it?", n=5))
    outs = _run(core)
    by_id = {rid: [o for o in outs if o.request_id == rid] for rid in "ab"}
    for rid, n in (("a", 12), ("b", 5)):
        tokens, final = by_id[rid][:-1], by_id[rid][-1]
        assert [o.index for o in tokens] == list(range(n))
        assert final.finish_reason == FinishReason.LENGTH and final.index == n
        assert all(o.token_id >= 0 and o.prompt_tokens > 0 for o in tokens)
    assert core.blocks.available == free and not core.has_work()


def test_abort_ends_a_request_with_one_cancelled_record_and_others_go_on(parts):
    core = _core(parts)
    core.add(_request("keep", "Tell me a story", n=10))
    core.add(_request("stop", "Tell me another", n=10))
    first = core.step() + core.step()
    assert any(o.request_id == "stop" for o in first)
    cancelled = core.abort("stop")
    assert [(o.request_id, o.finish_reason) for o in cancelled] == [("stop", "cancelled")]
    assert core.abort("stop") == [] and core.abort("never-added") == []
    rest = _run(core)
    assert not any(o.request_id == "stop" for o in rest)
    assert rest[-1].request_id == "keep" and rest[-1].finish_reason == FinishReason.LENGTH


def test_fail_all_ends_every_open_request_with_the_error(parts):
    core = _core(parts)
    core.add(_request("x", "one"))
    core.add(_request("y", "two"))
    core.step()
    outs = core.fail_all("boom")
    assert sorted((o.request_id, o.finish_reason, o.error) for o in outs) == [
        ("x", "error", "boom"),
        ("y", "error", "boom"),
    ]
    assert not core.has_work()


async def test_the_threaded_client_gives_the_cores_tokens_and_detokenises_them(parts):
    model_dir, model, tok = parts
    core = _core(parts)
    core.add(_request("r", "Count to five", n=16))
    want = [o.token_id for o in _run(core) if o.finish_reason is None]
    engine = LLMEngine(
        model_dir, EngineConfig(num_blocks=64, torchscript=False), model=model, tokenizer=tok
    )
    try:
        events = [e async for e in engine.submit(_request("r", "Count to five", n=16))]
    finally:
        engine.close()
    assert [e.token_id for e in events[:-1]] == want
    assert "".join(e.text for e in events) == tok.decode(want, skip_special_tokens=True)
    assert events[-1].finish_reason == FinishReason.LENGTH
