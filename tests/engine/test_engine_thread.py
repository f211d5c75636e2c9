"""The engine thread builds its core on itself and steps it there: one thread runs all of the
core's torch work (two threads' OpenMP teams oversubscribe a small CPU; see EngineThread)."""

import threading

import pytest

from voicert.core.chat import ChatMessage
from voicert.core.llm import EngineLoad, FinishReason, GenerationRequest
from voicert.engine.base import final_out
from voicert.engine.clients.llm_engine import EngineThread
from voicert.engine.settings import EngineConfig


class FakeCore:
    """A core that answers each request with its final record, one step later; it notes the
    thread each call came on."""

    def __init__(self) -> None:
        self.cfg = EngineConfig()
        self.threads: set[int] = {threading.get_ident()}
        self.open: list[str] = []

    def _on(self) -> None:
        self.threads.add(threading.get_ident())

    def load(self) -> EngineLoad:
        self._on()
        return EngineLoad(running=len(self.open))

    def add(self, request, guide=None, built=False) -> None:
        self._on()
        self.open.append(request.request_id)

    def has_work(self) -> bool:
        self._on()
        return bool(self.open)

    def step(self, run_ahead: bool = True):
        self._on()
        done, self.open = self.open, []
        return [final_out(rid, FinishReason.STOP) for rid in done]

    def abort(self, request_id: str):
        return []

    def fail_all(self, error: str):
        return []


def test_the_core_is_built_and_stepped_on_the_engine_thread_alone():
    made: list[FakeCore] = []
    got = threading.Event()
    finals = []

    def deliver(outs):
        finals.extend(outs)
        got.set()

    engine = EngineThread(lambda: made.append(FakeCore()) or made[0], deliver)
    try:
        assert engine.core is made[0] and threading.get_ident() not in made[0].threads
        engine.add(GenerationRequest("r1", [ChatMessage("user", "Hi")], 4))
        assert got.wait(10)
        assert [o.request_id for o in finals] == ["r1"]
        assert made[0].threads == {engine._thread.ident}
    finally:
        engine.stop()


def test_a_core_that_cannot_be_built_fails_the_constructor_with_its_error():
    def build():
        raise ValueError("no such model")

    with pytest.raises(ValueError, match="no such model"):
        EngineThread(build, lambda outs: None)
