"""The engine supervisor, with fake engines (no models): a failed engine's requests end with an
error, requests while it is down end at once (never hang), it is rebuilt with back-off, and too
many failures make it give up and say so."""

from __future__ import annotations

import asyncio
import dataclasses
import threading

import pytest

from voicert.core.chat import ChatMessage
from voicert.core.llm import EngineBase, EngineState, EngineStats, GenerationRequest
from voicert.engine.clients.supervisor import RestartPolicy, SupervisedEngine


class FakeEngine(EngineBase):
    """Answers every request with one final event; ``die()`` is what a crash looks like to the
    supervisor (the engine calls ``on_failure``)."""

    built = 0

    def __init__(self) -> None:
        FakeEngine.built += 1
        self.number = FakeEngine.built
        self.closed = False
        self.submitted: list[str] = []

    def submit(self, request):
        from voicert.core.llm import EndedStream, final_event

        self.submitted.append(request.request_id)
        return EndedStream(final_event("stop"))

    def cancel(self, request_id):
        pass

    def stats(self):
        return EngineStats()

    def close(self):
        self.closed = True

    def die(self, why="boom"):
        self.on_failure(why)


def request(rid="r"):
    return GenerationRequest(rid, [ChatMessage("user", "hi")], 4)


async def first_event(stream):
    async for ev in stream:
        return ev


def wait_for_state(sup, state, timeout=10.0):
    done = threading.Event()
    for _ in range(int(timeout / 0.01)):
        if sup.state is state:
            return
        done.wait(0.01)
    raise AssertionError(f"state stayed {sup.state}, expected {state}")


FAST = RestartPolicy(max_restarts=3, window_s=60, backoff_s=0.01, max_backoff_s=0.02)


async def test_a_failed_engine_is_rebuilt_and_serves_again():
    sup = SupervisedEngine(FakeEngine, FAST)
    try:
        first = sup.engine
        first.die("killed")
        assert not sup.healthy
        wait_for_state(sup, EngineState.SERVING)
        assert sup.engine is not first and first.closed and sup.restarts == 1
        ev = await first_event(sup.submit(request("after")))
        assert ev.finish_reason == "stop" and sup.engine.submitted == ["after"]
        assert sup.stats().extra["engine_restarts"] == 1.0
    finally:
        sup.close()


async def test_without_a_wait_requests_while_down_end_at_once_with_a_typed_error():
    gate = threading.Event()
    builds = []

    def build():
        builds.append(1)
        if len(builds) > 1:
            gate.wait(10)  # the rebuild takes a while
        return FakeEngine()

    sup = SupervisedEngine(build, dataclasses.replace(FAST, wait_s=0))
    try:
        sup.engine.die("killed")
        assert sup.state is EngineState.RESTARTING
        ev = await first_event(sup.submit(request()))
        assert ev.finish_reason == "error" and "engine unavailable" in ev.error
        assert "killed" in ev.error
        gate.set()
        wait_for_state(sup, EngineState.SERVING)
    finally:
        gate.set()
        sup.close()


async def test_a_failing_rebuild_is_retried_with_back_off():
    attempts = []

    def build():
        attempts.append(1)
        if len(attempts) in (2, 3):  # the first two rebuilds fail
            raise RuntimeError("no memory")
        return FakeEngine()

    sup = SupervisedEngine(build, RestartPolicy(max_restarts=5, window_s=60, backoff_s=0.01))
    try:
        sup.engine.die()
        wait_for_state(sup, EngineState.SERVING)
        assert len(attempts) == 4 and sup.restarts == 1
    finally:
        sup.close()


async def test_too_many_failures_give_up_and_tell_the_server():
    gave_up = []
    sup = SupervisedEngine(FakeEngine, FAST, on_give_up=gave_up.append)
    try:
        for _ in range(FAST.max_restarts):
            sup.engine.die()
            wait_for_state(sup, EngineState.SERVING)
        sup.engine.die()  # one more than allowed within the window
        wait_for_state(sup, EngineState.FAILED)
        assert gave_up and "engine failures" in gave_up[0]
        ev = await first_event(sup.submit(request()))
        assert ev.finish_reason == "error"
    finally:
        sup.close()


def test_an_engine_that_cannot_start_fails_the_supervisor_at_once():
    def build():
        raise RuntimeError("bad weights")

    with pytest.raises(RuntimeError, match="bad weights"):
        SupervisedEngine(build, FAST)


def slow_rebuild():
    """A build function whose rebuilds wait for the returned gate."""
    gate = threading.Event()
    builds = []

    def build():
        builds.append(1)
        if len(builds) > 1:
            gate.wait(10)
        return FakeEngine()

    return build, gate


async def test_a_request_made_during_a_restart_waits_and_is_served_by_the_new_engine():
    build, gate = slow_rebuild()
    sup = SupervisedEngine(build, FAST)
    try:
        sup.engine.die("killed")
        waiting = asyncio.ensure_future(first_event(sup.submit(request("patient"))))
        await asyncio.sleep(0)  # it waits (no event yet) while the engine is rebuilt...
        assert not waiting.done()
        gate.set()
        ev = await asyncio.wait_for(waiting, 60)
        assert ev.finish_reason == "stop" and sup.engine.submitted == ["patient"]
    finally:
        gate.set()
        sup.close()


async def test_a_waiting_request_can_be_cancelled():
    build, gate = slow_rebuild()
    sup = SupervisedEngine(build, FAST)
    try:
        sup.engine.die("killed")
        waiting = asyncio.ensure_future(first_event(sup.submit(request("changed-mind"))))
        await asyncio.sleep(0)
        sup.cancel("changed-mind")
        ev = await asyncio.wait_for(waiting, 60)
        assert ev.finish_reason == "cancelled"
    finally:
        gate.set()
        sup.close()


async def test_a_request_that_waits_too_long_ends_with_a_typed_error():
    build, gate = slow_rebuild()
    sup = SupervisedEngine(build, dataclasses.replace(FAST, wait_s=0.05))
    try:
        sup.engine.die("killed")
        ev = await asyncio.wait_for(first_event(sup.submit(request())), 60)
        assert ev.finish_reason == "error" and "unavailable" in ev.error
    finally:
        gate.set()
        sup.close()
