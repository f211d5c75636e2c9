"""One engine host shared by several workers (server.workers): each worker gets exactly the
tokens the in-process engine makes, even with the same request ids; a worker that hangs up has
its requests aborted while the others go on; a host that dies fails every worker's requests, and
the workers' supervisors reconnect to the host started in its place."""

import asyncio
import os

import pytest

from voicert.config import cache_dir, load_config
from voicert.core.chat import ChatMessage
from voicert.core.llm import EngineState, GenerationRequest
from voicert.engine.clients.host import SharedEngineClient, start_engine_host
from voicert.engine.clients.llm_engine import LLMEngine
from voicert.engine.clients.supervisor import RestartPolicy, SupervisedEngine
from voicert.engine.loader import resolve_llm
from voicert.engine.settings import EngineConfig

SYSTEM = ChatMessage("system", "You are a helpful voice assistant. Answer in one short sentence.")
QUESTIONS = ["What is the capital of France?", "Name three colors.", "Spell the word voice."]
KEY = b"test-key"


@pytest.fixture(scope="module")
def model_dir():
    return str(resolve_llm("embedded", cache_dir(load_config(environ={}).models)))


@pytest.fixture(scope="module")
def address(tmp_path_factory):
    return str(tmp_path_factory.mktemp("host") / "engine.sock")


@pytest.fixture(scope="module")
def host(model_dir, address):
    host = start_host(model_dir, address)
    yield host
    host.stop()


def start_host(model_dir, address):
    host = start_engine_host(
        model_dir, EngineConfig(kv_memory_gb=0.25, torchscript=False), address, KEY, threads=1
    )
    host.wait_ready()
    return host


def request(rid: str, text: str, n: int = 24) -> GenerationRequest:
    return GenerationRequest(rid, [SYSTEM, ChatMessage("user", text)], n, ignore_eos=True)


async def collect(engine, rid: str, text: str, n: int = 24):
    return [ev async for ev in engine.submit(request(rid, text, n))]


async def test_two_workers_get_the_in_process_tokens_with_the_same_request_ids(
    model_dir, address, host
):
    a = SharedEngineClient(address, KEY, model_dir, connect_timeout_s=30)
    b = SharedEngineClient(address, KEY, model_dir, connect_timeout_s=30)
    local = LLMEngine(model_dir, EngineConfig(kv_memory_gb=0.25, torchscript=False))
    try:
        assert a.pid == b.pid == host.pid != os.getpid()
        expected = [await collect(local, f"l{i}", q) for i, q in enumerate(QUESTIONS)]
        # the same ids from both workers at once: each gets its own answers, in order
        got_a, got_b = await asyncio.gather(
            asyncio.gather(*(collect(a, f"r{i}", q) for i, q in enumerate(QUESTIONS))),
            asyncio.gather(
                *(collect(b, f"r{i}", q) for i, q in reversed(list(enumerate(QUESTIONS))))
            ),
        )
        got_b = list(reversed(got_b))
        for want, x, y in zip(expected, got_a, got_b):
            ids = [e.token_id for e in want]
            assert [e.token_id for e in x] == ids and [e.token_id for e in y] == ids
            assert "".join(e.text for e in x) == "".join(e.text for e in want)
            assert x[-1].finish_reason == "length" and len(x) == 25
        # every step is counted once, by one worker
        await asyncio.sleep(0)
        steps_a, steps_b = a.drain_steps(), b.drain_steps()
        assert steps_a and not steps_b
        assert a.stats().submitted == b.stats().submitted == 3
    finally:
        local.close()
        a.close()
        b.close()


async def test_a_worker_that_hangs_up_has_its_requests_aborted_and_the_others_go_on(
    model_dir, address, host
):
    a = SharedEngineClient(address, KEY, model_dir, connect_timeout_s=30)
    b = SharedEngineClient(address, KEY, model_dir, connect_timeout_s=30)
    try:
        stream = a.submit(request("long", "Count to one thousand.", 2000))
        seen = 0
        async for ev in stream:  # noqa: B007 - the last one is checked below
            seen += 1
            if seen == 3:
                a.close()  # the worker leaves (its process ends) mid-reply
        assert ev.finish_reason == "error" and ev.error == "engine closed"
        done = await collect(b, "other", QUESTIONS[0])
        assert done[-1].finish_reason == "length" and len(done) == 25
        # the engine let go of the long request: nothing runs, nothing waits
        for _ in range(100):
            load = b.load()
            if load.running == 0 and load.waiting == 0 and b.stats().active == 0:
                break
            await asyncio.sleep(0.1)
        assert load.running == 0 and load.waiting == 0
    finally:
        b.close()


async def test_a_host_that_dies_fails_every_workers_requests_and_they_reconnect_to_the_next(
    model_dir, address, host
):
    policy = RestartPolicy(max_restarts=3, window_s=600, backoff_s=0.05)
    replacement = None
    workers = [
        SupervisedEngine(
            lambda: SharedEngineClient(address, KEY, model_dir, connect_timeout_s=60), policy
        )
        for _ in range(2)
    ]
    try:
        streams = [w.submit(request("doomed", "Count to a thousand.", 2000)) for w in workers]
        events = [[], []]

        async def read(i):
            async for ev in streams[i]:
                events[i].append(ev)
                if i == 0 and len(events[0]) == 3:
                    host.kill()  # what a crash (or the OOM killer) looks like

        await asyncio.gather(read(0), read(1))
        for evs in events:
            assert evs[-1].finish_reason == "error" and "went away" in evs[-1].error
        replacement = start_host(model_dir, address)  # the primary starts another there
        for w in workers:
            for _ in range(300):
                if w.state is EngineState.SERVING and w.restarts == 1:
                    break
                await asyncio.sleep(0.1)
            assert w.state is EngineState.SERVING and w.restarts == 1
            after = await collect(w, "after", QUESTIONS[0])
            assert after[-1].finish_reason == "length" and len(after) == 25
    finally:
        for w in workers:
            w.close()
        if replacement is not None:
            replacement.stop()


def test_a_host_that_cannot_load_fails_its_start_with_the_reason(tmp_path):
    host = start_engine_host(
        str(tmp_path), EngineConfig(kv_memory_gb=0.1, torchscript=False), str(tmp_path / "s"), KEY
    )
    with pytest.raises(RuntimeError, match="engine host failed to start"):
        host.wait_ready(120)


def test_no_host_is_a_clear_error_after_the_connect_timeout(tmp_path):
    with pytest.raises(RuntimeError, match="no host at"):
        SharedEngineClient(str(tmp_path / "none.sock"), KEY, str(tmp_path), connect_timeout_s=0.3)
