"""One reply: the engine's token stream turned into text events and, when asked for, speech.

The session builds the request and decides what happens to the outcome (history, metrics, the
closing events); a :class:`Reply` only streams: it submits the request, marks the latency points of
its first token, emits a :class:`~voicert.core.events.ReplyToken` per token, feeds the speech, and
ends with a :class:`ReplyOutcome`. It can be tested alone with a fake engine and a fake emit.

When the request offers tools, the text goes through a :class:`~voicert.agent.tool_calls.CallParser`:
what is said is emitted and spoken as before; a call's text never is: it becomes ``ToolCall*``
events (the session gives each call its id and item) and the outcome's ``calls``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

from voicert.agent import tool_calls as tc
from voicert.agent.speech_out import SpeechOut
from voicert.core import events as ev
from voicert.core.chat import ToolCall
from voicert.core.llm import Engine, FinishReason, GenerationRequest, TokenEvent
from voicert.core.session import ErrorCode
from voicert.telemetry.latency import Point, TurnTrace

Emit = Callable[[ev.SessionEvent], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class ReplyOutcome:
    text: str  # what was sent (stripped); "" when nothing was
    tokens: int  # tokens sent
    prompt_tokens: int
    reason: str  # stop | length | error | the reason given to cancel (interrupted, cancelled...)
    calls: tuple[ToolCall, ...] = ()  # complete tool calls, in order (duplicates dropped)
    broken_calls: int = 0  # calls the reply ended inside of, or that did not parse
    call_items: dict[str, str] = field(default_factory=dict)  # call id -> its announced item id


class CallIds(Protocol):
    """How a reply names its calls and their items (the session's counters)."""

    def call_id(self) -> str: ...

    def item_id(self) -> str: ...


class Reply:
    """Contract: construct, then ``await run()`` once; ``cancel(reason)`` may be called at any time
    from the event loop. After a cancel no further token is emitted or spoken; the engine is asked
    to stop and ``run`` returns when it confirms (within one engine step), with ``reason`` as the
    outcome's. ``speech`` (optional) is fed each token and waited for: the reply ends when its last
    audio has been sent."""

    def __init__(
        self,
        engine: Engine,
        request: GenerationRequest,
        turn_id: int,
        trace: TurnTrace,
        emit: Emit,
        speech: SpeechOut | None = None,
        ids: CallIds | None = None,
        server_tools: frozenset[str] = frozenset(),
        announce: bool = True,
        stream: AsyncIterator[TokenEvent] | None = None,
    ) -> None:
        """``stream``: the request's events, when it was submitted already (a reply started
        ahead of the endpoint); else ``run`` submits it."""
        self.engine = engine
        self._submitted = stream
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
        self.parser = tc.CallParser() if request.tools else None
        self.ids = ids
        self.server_tools = server_tools  # names of the tools the server runs itself
        self.announce = announce  # emit ReplyStarted (False: a later round of the same reply)
        self._open: dict[int, tuple[str, str]] = {}  # call index -> (call id, item id)
        self._calls: list[ToolCall] = []
        self._broken = 0
        self.repeats = tc.RepeatFilter()
        self._looped = False  # stopped for repeating its calls: the reply ends as a stop

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
        stream = self._submitted or self.engine.submit(self.request)
        self.trace.mark(Point.SUBMIT, self.request.submit_ns)
        if self.announce:
            await self.emit(ev.ReplyStarted(self.turn_id, self.speech is not None))
        reason = FinishReason.ERROR.value
        try:
            reason = await self._stream(stream)
            if self.parser is not None and not self.cancel_requested:
                await self._pieces(self.parser.close(), -1)
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
            self.outcome = ReplyOutcome(
                "".join(self._parts).strip(),
                self._tokens,
                self._prompt_tokens,
                reason,
                tuple(self._calls),
                self._broken,
                dict(self._open.values()),
            )
        return self.outcome

    async def _stream(self, stream) -> str:
        """Emit (and speak) each token until the engine's final event; its finish reason."""
        async for tok in stream:
            self._prompt_tokens = tok.prompt_tokens or self._prompt_tokens
            if tok.finish_reason is not None:
                if tok.error:
                    await self.emit(ev.SessionError(ErrorCode.ENGINE_FAILED.value, tok.error))
                if tok.finish_reason == FinishReason.CANCELLED:
                    return (
                        FinishReason.STOP.value
                        if self._looped and not self.cancel_requested
                        else self.cancel_reason
                    )
                return tok.finish_reason
            if self.cancel_requested:
                continue  # the engine stops within a step; tokens already made are dropped
            if tok.index == 0:
                self.trace.mark(Point.PREFILL_START, tok.prefill_start_ns)
                self.trace.mark(Point.FIRST_TOKEN_SAMPLED, tok.sampled_ns)
                self.trace.mark(Point.FIRST_TOKEN_RECEIVED)
            self._tokens += 1
            if self.parser is not None:
                await self._pieces(self.parser.feed(tok.text), tok.index)
            else:
                await self._say(tok.text, tok.index)
        return FinishReason.ERROR.value  # a stream that ended without its final event

    async def _say(self, text: str, index: int) -> None:
        self._parts.append(text)
        await self.emit(ev.ReplyToken(self.turn_id, index, text))
        self.trace.mark(Point.FIRST_TOKEN_SENT)
        if self.speech is not None:
            self.speech.feed(text)

    async def _pieces(self, pieces: list[tc.Piece], index: int) -> None:
        """Emit what the parser made of a token's text (index -1: the end of the reply); a call
        that repeats an earlier one of this reply is dropped unseen (tc.RepeatFilter)."""
        for piece in self.repeats.push(pieces):
            if isinstance(piece, tc.Said):
                await self._say(piece.text, max(index, 0))
            elif isinstance(piece, tc.CallBroken):
                self._broken += 1
            else:
                await self._piece(piece)
        if self.repeats.looping and not self._looped:  # the model repeats its calls: enough
            self._looped = True
            self.engine.cancel(self.request_id)

    async def _piece(self, piece: tc.Piece) -> None:
        if isinstance(piece, tc.CallOpened):
            ids = (
                (self.ids.call_id(), self.ids.item_id())
                if self.ids
                else (f"call_{self.request_id}_{piece.index}", "")
            )
            self._open[piece.index] = ids
            await self.emit(ev.ToolCallStarted(self.turn_id, ids[0], piece.name, ids[1]))
            self.trace.mark(Point.FIRST_TOKEN_SENT)
        elif isinstance(piece, tc.CallArgs):
            await self.emit(
                ev.ToolCallArguments(self.turn_id, self._open[piece.index][0], piece.delta)
            )
        elif isinstance(piece, tc.CallClosed):
            await self._closed(piece)

    async def _closed(self, piece: tc.CallClosed) -> None:
        call_id, item_id = self._open[piece.index]
        self._calls.append(ToolCall(call_id, piece.name, piece.arguments))
        self.trace.mark(Point.TOOL_CALL)
        await self.emit(
            ev.ToolCallDone(
                self.turn_id,
                call_id,
                piece.name,
                piece.arguments,
                item_id,
                piece.name in self.server_tools,
            )
        )
