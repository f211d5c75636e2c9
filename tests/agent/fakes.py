"""Fake services for agent tests: no models, no threads, no sleeping. The VAD scores energy, the
ASR answers from a script when the test says so, the engine streams a scripted reply as fast as
the test lets it."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import numpy as np

from voicert.core.llm import EngineBase, EngineStats, TokenEvent, final_event
from voicert.core.speech import AsrBase, Ending, Transcript, TurnAudio


class EnergyVad:
    """Stands in for SileroVad: a window is speech when its mean magnitude is over 0.05."""

    def probs(self, windows: np.ndarray, state) -> np.ndarray:
        return np.where(np.abs(windows).mean(axis=1) > 0.05, 0.9, 0.05).astype(np.float32)


@dataclass
class FakeDecode:
    audio: np.ndarray
    priority: int
    future: asyncio.Future
    started: bool = False
    dropped: bool = False

    def drop(self) -> bool:
        if self.started:
            return False
        self.dropped = True
        self.future.cancel()
        return True


def ending_of(text: str) -> Ending | None:
    """The recogniser's opinion of what follows ``text``'s last word, sure of the mark written
    there: a sentence end, a pause mark, or (no mark) neither."""
    if not text.strip():
        return None
    last = text.rstrip()[-1]
    if last in ".?!":
        return Ending(stop=0.9, comma=0.02)
    if last == ",":
        return Ending(stop=0.05, comma=0.9)
    return Ending(stop=0.1, comma=0.1)


class FakeAsr(AsrBase):
    """Every decode waits until the test calls :meth:`answer` (or ``auto`` answers at once)."""

    def __init__(self, text: str = "what is the capital of france", auto: bool = True) -> None:
        self.text = text
        self.auto = auto
        self.decodes: list[FakeDecode] = []

    def submit(self, audio: np.ndarray, priority: int = 0) -> FakeDecode:
        decode = FakeDecode(audio, priority, asyncio.get_running_loop().create_future())
        self.decodes.append(decode)
        if self.auto:
            self.answer(decode)
        return decode

    def answer(
        self, decode: FakeDecode, text: str | None = None, ending: Ending | None = None
    ) -> None:
        """Settle ``decode`` with ``text`` (default: the fake's own). ``ending`` (default: as
        Whisper's argmax would have it, sure of the mark the text ends with)."""
        decode.started = True
        if not decode.future.done():
            said = self.text if text is None else text
            decode.future.set_result(
                Transcript(
                    said,
                    decode.audio.size / 16000,
                    1.0,
                    0.0,
                    0.0,
                    1,
                    ending=ending or ending_of(said),
                )
            )

    def pending(self) -> int:
        return sum(1 for d in self.decodes if not d.future.done())

    def close(self) -> None:
        pass


@dataclass
class FakeEngine(EngineBase):
    """Streams ``reply`` word by word. With ``gate`` set, each token waits for the test to call
    :meth:`release`; cancel ends the stream with ``cancelled`` at the next token."""

    reply: str = "The capital of France is Paris."
    gated: bool = False
    script: list = field(
        default_factory=list
    )  # replies for the next requests, in order (then reply)
    requests: list = field(default_factory=list)
    cancelled: set = field(default_factory=set)
    fail: str = ""  # set: every request ends at once with this error (an engine, or server, down)
    end_probs: dict | None = None  # set: it scores (score_end): the user's last words -> P(end)
    turn_probs: dict | None = None  # set: its model has an end-of-turn head: words -> P(over)
    _gates: dict = field(default_factory=dict)

    @property
    def scores(self) -> bool:
        return self.end_probs is not None

    def submit(self, request):
        self.requests.append(request)
        return self._stream(request)

    async def _stream(self, request):
        if request.score_end:
            words = request.messages[-1].content
            prob = (self.end_probs or {}).get(words)
            head = None if self.turn_probs is None else self.turn_probs.get(words)
            yield TokenEvent(0, -1, "", 1, 1, 10, "stop", None, prob, head)
            return
        if self.fail:
            yield final_event("error", self.fail)
            return
        words = (self.script.pop(0) if self.script else self.reply).split(" ")
        n = min(len(words), request.max_new_tokens)
        for i in range(n):
            if self.gated:
                gate = self._gates.setdefault(request.request_id, asyncio.Event())
                await gate.wait()
                gate.clear()
            if request.request_id in self.cancelled:
                yield final_event("cancelled", index=i)
                return
            text = (" " if i else "") + words[i]
            yield TokenEvent(i, 100 + i, text, 1, 1, 10)
        yield final_event("stop" if n == len(words) else "length", index=n)

    def release(self, request_id: str | None = None) -> None:
        rid = request_id or self.requests[-1].request_id
        self._gates.setdefault(rid, asyncio.Event()).set()

    def cancel(self, request_id: str) -> None:
        self.cancelled.add(request_id)
        self.release(request_id)

    def stats(self):
        return EngineStats()

    def close(self):
        pass


class FakeJudge:
    """Stands in for the turn-completion model: answers ``prob`` (and its pause head's ``pause``)
    for every pause (or raises)."""

    def __init__(
        self,
        prob: float = 0.9,
        fail: bool = False,
        error: Exception | None = None,
        pause: float | None = None,
    ) -> None:
        self.prob = prob
        self.pause = pause
        self.error = error or (RuntimeError("model failed") if fail else None)
        self.calls: list[np.ndarray] = []

    async def score(self, audio: np.ndarray) -> TurnAudio:
        self.calls.append(audio)
        if self.error is not None:
            raise self.error
        return TurnAudio(self.prob, self.pause)
