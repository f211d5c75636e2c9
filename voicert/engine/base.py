"""The engine interface the agent talks to. Any engine (the simple transformers one, the fast one)
implements :class:`Engine`; requests and token events are plain dataclasses."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import AsyncIterator, Protocol


@dataclass(frozen=True, slots=True)
class ChatMessage:
    role: str  # system | user | assistant
    content: str


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


@dataclass(frozen=True, slots=True)
class StepRecord:
    """One engine step, for metrics: what it ran and how long the step took on the engine thread
    (schedule + forward + the host sync that hands out its tokens)."""

    kind: str  # prefill | decode
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
