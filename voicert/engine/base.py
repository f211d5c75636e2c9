"""The engine interface the agent talks to. Any engine (the simple transformers one, the fast one)
implements :class:`Engine`; requests and token events are plain dataclasses."""

from __future__ import annotations

import enum
import threading
import time
from dataclasses import dataclass, field
from typing import AsyncIterator, Protocol

import msgspec

from voicert.engine.tools import AUTO, ToolCall, ToolChoice, ToolSpec


class FinishReason(enum.StrEnum):
    """Why a request's stream ended (the final TokenEvent's ``finish_reason``)."""

    STOP = "stop"  # the model ended its reply
    LENGTH = "length"  # max_new_tokens reached
    CANCELLED = "cancelled"  # Engine.cancel
    ERROR = "error"  # the request failed (bad input, a failed step, the engine went down)


class EngineState(enum.Enum):
    """An engine's lifecycle as its supervisor sees it (readiness follows it)."""

    STARTING = "starting"
    SERVING = "serving"
    RESTARTING = "restarting"  # failed; being rebuilt with back-off: requests fail at once
    FAILED = "failed"  # could not be brought back: the server exits
    CLOSED = "closed"


@dataclass(frozen=True, slots=True)
class ChatMessage:
    role: str  # system | user | assistant | tool
    content: str
    tool_calls: tuple[ToolCall, ...] = ()  # an assistant's calls (its content: any text before them)
    tool_call_id: str = ""  # a tool message: the call it answers


@dataclass(slots=True)
class GenerationRequest:
    """One reply to generate. ``messages`` is the whole conversation, system prompt first; the engine
    applies the model's chat template and drops the oldest turns if the prompt would not fit."""

    request_id: str
    messages: list[ChatMessage]
    max_new_tokens: int
    session_id: str = ""
    ignore_eos: bool = False  # benchmarks: always generate max_new_tokens
    prompt_ids: list[int] | None = None  # benchmarks: exact prompt tokens instead of messages
    submit_ns: int = 0  # set by Engine.submit (perf_counter_ns)
    tools: tuple[ToolSpec, ...] = ()  # functions the model may call (engine/tools.py)
    tool_choice: ToolChoice = AUTO
    parallel_tool_calls: bool = True  # several calls in one reply (else at most one)


@dataclass(frozen=True, slots=True)
class TokenEvent:
    """One generated token, or the final event of a request (``finish_reason`` set).

    Every event carries the engine-side timestamps of its request so the caller can mark latency
    points without reaching into the engine."""

    index: int  # 0-based position in the reply; the final event repeats the token count
    token_id: int  # -1 on a final event with no token
    text: str  # text delta this token adds (may be "" while a multi-byte character is incomplete)
    sampled_ns: int  # when the engine thread sampled this token
    prefill_start_ns: int
    prompt_tokens: int
    finish_reason: str | None = None  # stop | length | cancelled | error
    error: str | None = None


class TokenOut(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """What the engine core produces: one generated token id, or a request's final record
    (``finish_reason`` set, ``token_id`` -1). No text: the client detokenises
    (:class:`~voicert.engine.stream.TokenStream`), so the core's thread (or process) only steps."""

    request_id: str
    index: int  # 0-based position in the reply; the final record repeats the token count
    token_id: int
    sampled_ns: int
    prefill_start_ns: int
    prompt_tokens: int
    finish_reason: str | None = None
    error: str | None = None


@dataclass(frozen=True, slots=True)
class StepRecord:
    """One engine step, for metrics: what it ran and how long the step took on the engine thread
    (schedule + forward + the host sync that hands out its tokens)."""

    kind: str  # prefill | decode | verify (a decode step whose rows carried speculative drafts)
    batch: int  # sequences in the step
    seconds: float


@dataclass(slots=True)
class EngineStats:
    active: int = 0  # requests queued or running
    submitted: int = 0
    finished: int = 0
    cancelled: int = 0
    tokens: int = 0
    extra: dict[str, float] = field(default_factory=dict)


ROLES = ("system", "user", "assistant", "tool")


def request_problem(request: "GenerationRequest") -> str | None:
    """What makes ``request`` unservable (wrong types from an untrusted door, an empty prompt), or
    None. Engines check this when a request is submitted, so a bad request fails alone."""
    if not isinstance(request.request_id, str) or not request.request_id:
        return "request_id must be a non-empty string"
    if isinstance(request.max_new_tokens, bool) or not isinstance(request.max_new_tokens, int) \
            or request.max_new_tokens < 1:
        return "max_new_tokens must be a positive integer"
    if request.prompt_ids is not None:
        if not request.prompt_ids or not all(isinstance(t, int) and t >= 0
                                             for t in request.prompt_ids):
            return "prompt_ids must be non-empty non-negative integers"
        return None
    if not isinstance(request.messages, list) or not request.messages:
        return "messages must be a non-empty list"
    for i, m in enumerate(request.messages):
        if not isinstance(m, ChatMessage) or m.role not in ROLES or not isinstance(m.content, str):
            return f"messages[{i}] must be a ChatMessage with a role in {ROLES} and string content"
        if not all(isinstance(c, ToolCall) for c in m.tool_calls):
            return f"messages[{i}].tool_calls must be ToolCalls"
    if not all(isinstance(t, ToolSpec) for t in request.tools) \
            or not isinstance(request.tool_choice, ToolChoice):
        return "tools must be ToolSpecs and tool_choice a ToolChoice"
    names = {t.name for t in request.tools}
    if len(names) != len(request.tools):
        return "tool names must be unique"
    if request.tool_choice.name and request.tool_choice.name not in names:
        return f"tool_choice names {request.tool_choice.name!r}, which is not among the tools"
    return None


def refusal(request: "GenerationRequest") -> "EndedStream | None":
    """The stream to hand back at once for a request that cannot be served (see
    :func:`request_problem`), or None when it may be submitted."""
    problem = request_problem(request)
    if problem is None:
        return None
    return EndedStream(final_event(FinishReason.ERROR, f"bad request: {problem}"))


def final_event(reason: str, error: str | None = None, index: int = 0, prefill_start_ns: int = 0,
                prompt_tokens: int = 0) -> "TokenEvent":
    """The last event of a request's stream."""
    return TokenEvent(index, -1, "", time.perf_counter_ns(), prefill_start_ns, prompt_tokens,
                      finish_reason=reason, error=error)


def final_out(request_id: str, reason: str, error: str | None = None) -> "TokenOut":
    """The final record of a request that ends before (or without) reaching the engine core."""
    return TokenOut(request_id, 0, -1, time.perf_counter_ns(), 0, 0, reason, error)


class EndedStream:
    """A stream that was over before it began: one final event (a refused request)."""

    def __init__(self, event: "TokenEvent") -> None:
        self._event: TokenEvent | None = event

    def __aiter__(self) -> "EndedStream":
        return self

    async def __anext__(self) -> "TokenEvent":
        if self._event is None:
            raise StopAsyncIteration
        event, self._event = self._event, None
        return event


class RequestLedger:
    """Which requests an engine holds, and its counters; thread-safe (the event loop opens and
    queries, the engine thread closes)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._live: set[str] = set()
        self._stats = EngineStats()

    def opened(self, request_id: str, count: bool = True) -> None:
        with self._lock:
            self._live.add(request_id)
            self._stats.submitted += count

    def closed(self, request_id: str, reason: str, tokens: int) -> None:
        with self._lock:
            self._live.discard(request_id)
            self._stats.finished += 1
            self._stats.tokens += tokens
            self._stats.cancelled += reason == "cancelled"

    def holds(self, request_id: str) -> bool:
        with self._lock:
            return request_id in self._live

    def live(self) -> set[str]:
        with self._lock:
            return set(self._live)

    def snapshot(self) -> EngineStats:
        with self._lock:
            s = self._stats
            return EngineStats(len(self._live), s.submitted, s.finished, s.cancelled, s.tokens)


class Engine(Protocol):
    """Contract: ``submit`` returns at once; iterating the stream yields TokenEvents in order and ends
    after the one with ``finish_reason`` set. ``cancel`` may be called at any time, from the event
    loop, for a running, queued or finished request; a running request stops within one step and
    frees its state, and its stream ends with ``finish_reason='cancelled'``. Breaking out of the
    iteration early without ``cancel`` leaves the request running: always cancel."""

    def submit(self, request: GenerationRequest) -> AsyncIterator[TokenEvent]: ...

    def cancel(self, request_id: str) -> None: ...

    def stats(self) -> EngineStats: ...

    def close(self) -> None: ...
