"""One conversation: audio in, VAD and endpointing, turns (ASR -> LLM -> tokens out), history.

The session is driven by its connection: the connection decodes client events and calls the methods
here; the session sends server events through ``emit``. Each turn runs in one task so that reading
(cancel, barge-in, disconnect) goes on while a reply streams.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from dataclasses import dataclass, field
from typing import Awaitable, Callable

import numpy as np

from voicert.audio.buffer import AudioBuffer
from voicert.audio.pcm import AudioFormatError, StreamResampler, decode_pcm
from voicert.config import Config
from voicert.engine.base import ChatMessage, Engine, GenerationRequest
from voicert.protocol import native as p
from voicert.speech.asr import WhisperAsr
from voicert.speech.endpoint import Endpointer, EventKind
from voicert.speech.vad import FRAME, SAMPLE_RATE, SileroVad, VadStream
from voicert.telemetry.latency import Point, TurnRecord, TurnTrace, now_ns
from voicert.telemetry.metrics import Metrics

log = logging.getLogger(__name__)
Emit = Callable[[p.ServerEvent], Awaitable[None]]
_request_ids = itertools.count(1)


@dataclass(slots=True)
class Services:
    """What all sessions share: config and the loaded models."""

    cfg: Config
    vad: SileroVad
    asr: WhisperAsr
    engine: Engine
    metrics: Metrics = field(default_factory=Metrics)
    draining: bool = False  # set at shutdown: no new turns start


@dataclass(slots=True)
class Turn:
    turn_id: int
    trace: TurnTrace
    task: asyncio.Task | None = None
    request_id: str = ""
    cancel_requested: bool = False
    cancel_reason: str = "cancelled"


class Session:
    def __init__(self, session_id: str, start: p.SessionStart, services: Services, emit: Emit) -> None:
        self.id = session_id
        self.start = start
        self.svc = services
        self.cfg = services.cfg
        self.emit = emit
        self.system_prompt = start.system_prompt or self.cfg.llm.system_prompt
        self.max_new_tokens = start.max_new_tokens or self.cfg.llm.max_new_tokens
        self.history: list[ChatMessage] = []
        self.resampler = StreamResampler(start.sample_rate)
        self.vad = VadStream(services.vad)
        self.endpointer = Endpointer(self.cfg.vad)
        self.audio = AudioBuffer()
        self.utterance_start = 0  # absolute 16 kHz sample where the current utterance starts
        self.last_voice_ns = 0
        self.turn: Turn | None = None
        self._turn_ids = itertools.count(1)
        self.latencies: list[dict[str, float]] = []

    # ------------------------------------------------------------ audio and endpointing

    async def on_audio(self, data: bytes) -> None:
        """Raises ProtocolError(BAD_AUDIO) for bytes that are not whole samples or not finite."""
        received_ns = now_ns()
        try:
            x = decode_pcm(data, self.start.encoding)
        except AudioFormatError as exc:
            raise p.ProtocolError(p.ErrorCode.BAD_AUDIO, str(exc)) from None
        x16 = self.resampler(x)
        self.audio.append(x16)
        for prob in self.vad.push(x16):
            result = self.endpointer.step(float(prob))
            if result.voiced:
                self.last_voice_ns = received_ns
            if result.event is None:
                continue
            pos = result.event.window * FRAME
            if result.event.kind is EventKind.SPEECH_STARTED:
                pad = self.cfg.vad.speech_pad_ms * SAMPLE_RATE // 1000
                self.utterance_start = max(pos - pad, self.audio.base)
                await self.emit(p.SpeechStarted(audio_ms=pos * 1000 // SAMPLE_RATE))
            else:
                end = pos + FRAME
                await self.emit(p.SpeechStopped(audio_ms=end * 1000 // SAMPLE_RATE))
                if self.start.turn_detection == "server_vad":
                    self._end_turn(end)
        if not self.endpointer.in_speech and self.start.turn_detection == "server_vad":
            keep = self.cfg.vad.speech_pad_ms * SAMPLE_RATE // 1000 + FRAME
            self.audio.trim_before(self.audio.end - keep)
        else:
            cap = int(self.cfg.vad.max_utterance_s * SAMPLE_RATE)
            self.audio.trim_before(self.audio.end - cap)

    def commit(self) -> None:
        """Push-to-talk end of turn: everything since the last turn (or since speech started)."""
        self.endpointer.reset()
        start = self.utterance_start if self.start.turn_detection == "server_vad" else self.audio.base
        self.utterance_start = start
        self._end_turn(self.audio.end)

    def _end_turn(self, end: int) -> None:
        endpoint_ns = now_ns()
        audio = self.audio.slice(self.utterance_start, end)
        self.audio.trim_before(end)
        self.utterance_start = self.audio.end
        if audio.size < FRAME:
            return  # nothing to transcribe
        trace = TurnTrace(next(self._turn_ids))
        trace.mark(Point.VOICE_END, self.last_voice_ns or endpoint_ns)
        trace.mark(Point.ENDPOINT, endpoint_ns)
        previous = self.turn
        if previous is not None and previous.task is not None and not previous.task.done():
            self._cancel(previous, "interrupted")
        turn = Turn(trace.turn_id, trace)
        turn.task = asyncio.create_task(self._run_turn(turn, audio, previous),
                                        name=f"turn-{self.id}-{turn.turn_id}")
        self.turn = turn

    # ------------------------------------------------------------ turns

    def cancel_response(self) -> None:
        if self.turn is not None and self.turn.task is not None and not self.turn.task.done():
            self._cancel(self.turn, "cancelled")

    def _cancel(self, turn: Turn, reason: str) -> None:
        """Stop a turn. Once its request is in the engine, the engine is asked to stop and the turn
        ends when the engine confirms (within one step, state freed); before that, the task is
        cancelled outright."""
        if turn.cancel_requested:
            return
        turn.cancel_requested = True
        turn.cancel_reason = reason
        if turn.request_id:
            self.svc.engine.cancel(turn.request_id)
        else:
            turn.task.cancel()

    async def _run_turn(self, turn: Turn, audio: np.ndarray, previous: Turn | None) -> None:
        if previous is not None and previous.task is not None:
            await asyncio.gather(previous.task, return_exceptions=True)  # its history lands first
        if self.svc.draining:
            await self.emit(p.Error(p.ErrorCode.SHUTTING_DOWN.value,
                                    "server is shutting down; no new turns", fatal=False))
            return
        trace = turn.trace
        try:
            transcript = await self.svc.asr.transcribe(audio)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("session %s: ASR failed", self.id)
            await self.emit(p.Error(p.ErrorCode.ASR_FAILED.value, f"transcription failed: {exc}"))
            return
        trace.mark(Point.TRANSCRIPT)
        await self.emit(p.TranscriptFinal(turn.turn_id, transcript.text))
        if not transcript.text:
            return  # no speech found: no reply
        await self._reply(turn, transcript.text)

    async def _reply(self, turn: Turn, user_text: str) -> None:
        trace = turn.trace
        messages = [ChatMessage("system", self.system_prompt), *self.history,
                    ChatMessage("user", user_text)]
        turn.request_id = f"{self.id}-{next(_request_ids)}"
        request = GenerationRequest(turn.request_id, messages, self.max_new_tokens, self.id)
        stream = self.svc.engine.submit(request)
        trace.mark(Point.SUBMIT, request.submit_ns)
        parts: list[str] = []
        tokens, prompt_tokens, reason = 0, 0, "error"
        try:
            async for ev in stream:
                prompt_tokens = ev.prompt_tokens
                if ev.finish_reason is not None:
                    reason = turn.cancel_reason if ev.finish_reason == "cancelled" else ev.finish_reason
                    if ev.error:
                        await self.emit(p.Error(p.ErrorCode.ENGINE_FAILED.value, ev.error))
                    break
                if turn.cancel_requested:
                    continue  # the engine stops within a step; tokens already made are dropped
                if ev.index == 0:
                    trace.mark(Point.PREFILL_START, ev.prefill_start_ns)
                    trace.mark(Point.FIRST_TOKEN_SAMPLED, ev.sampled_ns)
                    trace.mark(Point.FIRST_TOKEN_RECEIVED)
                parts.append(ev.text)
                tokens += 1
                await self.emit(p.ResponseToken(turn.turn_id, ev.index, ev.text))
                trace.mark(Point.FIRST_TOKEN_SENT)
        except asyncio.CancelledError:  # only if cancelled from outside: free the engine anyway
            self.svc.engine.cancel(turn.request_id)
            reason = turn.cancel_reason
            raise
        finally:
            trace.mark(Point.DONE)
            reply = "".join(parts).strip()
            self.history += [ChatMessage("user", user_text)]
            if reply:
                self.history.append(ChatMessage("assistant", reply))
            record = TurnRecord.from_trace(trace, self.id, reason, tokens,
                                           self.cfg.telemetry.budget_ms)
            self.svc.metrics.observe_turn(record)
            stages = record.stages
            self.latencies.append(stages)
            log.info("turn %s/%d %s tokens=%d prompt=%d %s", self.id, turn.turn_id, reason, tokens,
                     prompt_tokens, " ".join(f"{k}={v:.1f}" for k, v in stages.items()))
            await self.emit(p.ResponseDone(turn.turn_id, reply, tokens, prompt_tokens, reason))
            await self.emit(p.TurnLatency(turn.turn_id, stages))

    async def wait_turn(self, timeout: float | None = None) -> bool:
        """Wait for the running turn (if any) to finish; False on timeout."""
        turn = self.turn
        if turn is None or turn.task is None or turn.task.done():
            return True
        done, _ = await asyncio.wait({turn.task}, timeout=timeout)
        return bool(done)

    async def close(self, reason: str = "cancelled") -> None:
        """Stop the running turn (the engine frees its request) and wait until it has unwound."""
        turn = self.turn
        if turn is not None and turn.task is not None and not turn.task.done():
            self._cancel(turn, reason)
            await asyncio.gather(turn.task, return_exceptions=True)
