"""Speaking one reply as its tokens arrive: pieces to the TTS worker, audio back out in order.

The reply's text deltas go through a :class:`SentenceSplitter`; each finished piece becomes a job
on the shared :class:`TtsWorker`, through the reply's lane. Chunks come back to the event loop
(``call_soon_threadsafe``) and one pump task resamples them to the client's rate, encodes them
(pcm16 / mu-law / A-law...) and emits them as ``response.audio`` events, in reply order.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import numpy as np

from voicert.audio.pcm import Resampler, encode_audio
from voicert.core.session import OutputAudio
from voicert.speech.sentences import SentenceSplitter
from voicert.speech.tts import TtsJob, TtsWorker
from voicert.speech.worker import WorkerClosed
from voicert.telemetry.latency import Point, TurnTrace, now_ns

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class AudioOut:
    """One chunk of reply speech, encoded for the client, and the samples it encodes."""

    seq: int  # 0-based within the reply
    audio: bytes
    text: str  # the piece this chunk starts ("" for the rest of a piece)
    samples: np.ndarray  # [M] float32 at the client's rate: what ``audio`` encodes


SendAudio = Callable[[AudioOut], Awaitable[None]]
_END = object()


class SpeechOut:
    """Speaks one reply. Call :meth:`feed` with each text delta, :meth:`finish` at the end of the
    text, then ``await`` :meth:`wait` until the last audio is sent. :meth:`cancel` (barge-in) drops
    queued pieces, stops the one being spoken and stops sending, at once."""

    def __init__(
        self,
        worker: TtsWorker,
        fmt: OutputAudio,
        send: SendAudio,
        trace: TurnTrace,
        first_clause_chars: int = 24,
        first_piece_words: int = 0,
        voice: str | None = None,
    ) -> None:
        """``voice``: one of the worker's voice ids (None: its default); raises KeyError for
        another."""
        self.worker = worker.lane()  # this reply's pieces one after another: audio in order
        self.fmt, self.send, self.trace = fmt, send, trace
        self.voice = voice
        self.loop = asyncio.get_running_loop()
        self.splitter = SentenceSplitter(first_clause_chars, first_piece_words)
        self.resampler = Resampler(worker.rate_of(voice), fmt.sample_rate)
        self.queue: asyncio.Queue = asyncio.Queue()
        self.jobs: list[TtsJob] = []
        self.finished = False
        self.done_pieces = 0
        self.seq = 0
        self._text = ""  # a piece's text not yet attached to a sent chunk
        self.pump = asyncio.ensure_future(self._pump())

    def feed(self, delta: str) -> None:
        for piece in self.splitter.push(delta):
            self._speak(piece)

    def finish(self) -> None:
        for piece in self.splitter.flush():
            self._speak(piece)
        self.finished = True
        self._maybe_end()

    async def wait(self) -> None:
        """Until the last chunk is sent, or :meth:`cancel` stopped the speech (never raises it)."""
        await asyncio.wait({self.pump})
        failed = None if self.pump.cancelled() else self.pump.exception()
        if failed is not None:
            raise failed

    def cancel(self) -> None:
        for job in self.jobs:
            job.cancel()
        self.pump.cancel()

    def _speak(self, piece: str) -> None:
        index = len(self.jobs)
        if index == 0:
            self.trace.mark(Point.TTS_START)
        first = True

        def on_chunk(chunk: np.ndarray) -> None:  # worker thread
            nonlocal first
            if first and index == 0:
                self._to_loop(self._first_chunk_made, job.taken_ns, now_ns())
            self._to_loop(self.queue.put_nowait, (chunk, piece if first else ""))
            first = False

        def on_done(error: BaseException | None) -> None:  # worker thread
            self._to_loop(self._piece_done)

        job = TtsJob(piece, on_chunk, on_done, self.voice)
        self.jobs.append(job)
        try:
            self.worker.submit(job, index)
        except WorkerClosed:  # the voice is down: this piece is not spoken, the reply goes on
            log.warning("speech out: the TTS worker is down; piece not spoken")
            self._piece_done()

    def _to_loop(self, callback, *args) -> None:
        """From a TTS thread: run ``callback(*args)`` on the event loop, or nowhere once that loop
        is closed (a piece still being spoken as the server or a bench shut down: nobody waits
        for it any more)."""
        try:
            self.loop.call_soon_threadsafe(callback, *args)
        except RuntimeError:
            if not self.loop.is_closed():
                raise

    def _first_chunk_made(self, taken_ns: int, made_ns: int) -> None:
        self.trace.mark(Point.TTS_TAKEN, taken_ns)
        self.trace.mark(Point.TTS_FIRST_CHUNK, made_ns)

    def _piece_done(self) -> None:
        self.done_pieces += 1
        self._maybe_end()

    def _maybe_end(self) -> None:
        if self.finished and self.done_pieces == len(self.jobs):
            self.queue.put_nowait(_END)

    async def _pump(self) -> None:
        while True:
            item = await self.queue.get()
            last = item is _END
            chunk, text = (np.zeros(0, np.float32), "") if last else item
            self._text = f"{self._text} {text}".strip() if text else self._text
            x = self.resampler(chunk, last=last)  # [M] at the client's rate
            if x.size:
                text, self._text = self._text, ""
                await self.send(AudioOut(self.seq, encode_audio(x, self.fmt.encoding), text, x))
                if self.seq == 0:
                    self.trace.mark(Point.FIRST_AUDIO_SENT)
                self.seq += 1
            if last:
                return
