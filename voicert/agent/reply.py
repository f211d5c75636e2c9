"""One reply: the engine's token stream turned into text events and, when asked for, speech.

The session builds the request and decides what happens to the outcome (history, metrics, the
closing events); a :class:`Reply` only streams: it submits the request, marks the latency points of
its first token, emits a :class:`~voicert.core.events.ReplyToken` per token, feeds the speech, and
ends with a :class:`ReplyOutcome`. It can be tested alone with a fake engine and a fake emit.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Awaitable, Callable

from voicert.agent.speech_out import SpeechOut
from voicert.core import events as ev
from voicert.engine.base import Engine, FinishReason, GenerationRequest
from voicert.protocol import native as p
from voicert.telemetry.latency import Point, TurnTrace

Emit = Callable[[ev.SessionEvent], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class ReplyOutcome:
    text: str  # what was sent (stripped); "" when nothing was
    tokens: int  # tokens sent
    prompt_tokens: int
    reason: str  # stop | length | error | the reason given to cancel (interrupted, cancelled...)


class Reply:
    """Contract: construct, then ``await run()`` once; ``cancel(reason)`` may be called at any time
    from the event loop. After a cancel no further token is emitted or spoken; the engine is asked
    to stop and ``run`` returns when it confirms (within one engine step), with ``reason`` as the
    outcome's. ``speech`` (optional) is fed each token and waited for: the reply ends when its last
    audio has been sent."""

    def __init__(self, engine: Engine, request: GenerationRequest, turn_id: int,
                 trace: TurnTrace, emit: Emit, speech: SpeechOut | None = None) -> None:
        self.engine = engine
        self.request = request
        self.turn_id = turn_id
        self.trace = trace
        self.emit = emit
        self.speech = speech
        self.cancel_requested = False
        self.cancel_reason = FinishReason.CANCELLED.value
        self._parts: list[str] = []
        self._tokens = 0
        self._prompt_tokens = 0
        self.outcome: ReplyOutcome | None = None  # set when run() ends, however it ends

    @property
    def request_id(self) -> str:
        return self.request.request_id

    def cancel(self, reason: str) -> None:
        if self.cancel_requested:
            return
        self.cancel_requested = True
        self.cancel_reason = reason
        if self.speech is not None:
            self.speech.cancel()
        self.engine.cancel(self.request_id)

    async def run(self) -> ReplyOutcome:
        stream = self.engine.submit(self.request)
        self.trace.mark(Point.SUBMIT, self.request.submit_ns)
        await self.emit(ev.ReplyStarted(self.turn_id, self.speech is not None))
        reason = FinishReason.ERROR.value
        try:
            reason = await self._stream(stream)
            if self.speech is not None and not self.cancel_requested:
                self.speech.finish()
                await self.speech.wait()  # the reply ends when its last audio is sent
                if self.cancel_requested:  # barge-in while it was being spoken
                    reason = self.cancel_reason
        except asyncio.CancelledError:  # only if cancelled from outside: free the engine anyway
            self.engine.cancel(self.request_id)
            reason = self.cancel_reason
            raise
        finally:
            if self.speech is not None and (self.cancel_requested or reason == "error"):
                self.speech.cancel()
            self.trace.mark(Point.DONE)
            self.outcome = ReplyOutcome("".join(self._parts).strip(), self._tokens,
                                        self._prompt_tokens, reason)
        return self.outcome

    async def _stream(self, stream) -> str:
        """Emit (and speak) each token until the engine's final event; its finish reason."""
        async for tok in stream:
            self._prompt_tokens = tok.prompt_tokens or self._prompt_tokens
            if tok.finish_reason is not None:
                if tok.error:
                    await self.emit(ev.SessionError(p.ErrorCode.ENGINE_FAILED.value, tok.error))
                if tok.finish_reason == FinishReason.CANCELLED:
                    return self.cancel_reason
                return tok.finish_reason
            if self.cancel_requested:
                continue  # the engine stops within a step; tokens already made are dropped
            if tok.index == 0:
                self.trace.mark(Point.PREFILL_START, tok.prefill_start_ns)
                self.trace.mark(Point.FIRST_TOKEN_SAMPLED, tok.sampled_ns)
                self.trace.mark(Point.FIRST_TOKEN_RECEIVED)
            self._parts.append(tok.text)
            self._tokens += 1
            await self.emit(ev.ReplyToken(self.turn_id, tok.index, tok.text))
            self.trace.mark(Point.FIRST_TOKEN_SENT)
            if self.speech is not None:
                self.speech.feed(tok.text)
        return FinishReason.ERROR.value  # a stream that ended without its final event
