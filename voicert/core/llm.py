"""The engine's contract: what is asked of it, what it streams back, and the interface every
engine (in-process, in a process, on a host, supervised, replicated, a remote OpenAI-compatible
server) implements in full, so that no caller probes an engine for what it has.

The contract floor: standard library only.
"""

from __future__ import annotations

import abc
import enum
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Protocol

from voicert.core.chat import AUTO, ROLES, ChatMessage, ToolCall, ToolChoice, ToolSpec


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
class Sampling:
    """How a request's tokens are chosen. ``temperature`` 0 (the default): greedy, the most likely
    token each step. Above 0 (at most 2): drawn from the distribution at that temperature, cut to
    the ``top_k`` most likely (0: no cut) and to the nucleus of probability ``top_p`` (1: no cut);
    ``seed`` fixes the draws (None: a fresh one per request)."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


GREEDY = Sampling()


def sampling_problem(s: Sampling) -> str | None:
    """What is out of range in ``s``, or None."""
    if not isinstance(s, Sampling):
        return "sampling must be a Sampling"
    if isinstance(s.temperature, bool) or not isinstance(s.temperature, (int, float)):
        return "temperature must be a number"
    if not 0 <= s.temperature <= 2:
        return "temperature must be in [0, 2]"
    if isinstance(s.top_p, bool) or not isinstance(s.top_p, (int, float)) or not 0 < s.top_p <= 1:
        return "top_p must be a number in (0, 1]"
    if isinstance(s.top_k, bool) or not isinstance(s.top_k, int) or s.top_k < 0:
        return "top_k must be a non-negative integer"
    if s.seed is not None and (isinstance(s.seed, bool) or not isinstance(s.seed, int)):
        return "seed must be an integer"
    return None


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
    tools: tuple[ToolSpec, ...] = ()  # functions the model may call (engine/core/tools.py)
    tool_choice: ToolChoice = AUTO
    parallel_tool_calls: bool = True  # several calls in one reply (else at most one)
    # Score, do not generate: the last (user) message is left open, as if its speaker were still
    # talking, and the stream is one final event whose ``end_prob`` is the model's probability
    # that the message ends there (its end-of-message token next), with ``turn_prob`` where the
    # model has a trained end-of-turn head. max_new_tokens must be 1.
    # Engines that can score say so (``Engine.scores``); the others fail such a request.
    score_end: bool = False
    sampling: Sampling = GREEDY  # greedy unless a temperature above 0 is asked for


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
    finish_reason: str | None = None  # a FinishReason value
    error: str | None = None
    end_prob: float | None = None  # a score_end request's final event: P(the message ends here)
    # ... and P(the user's turn is over) from the model's trained end-of-turn head, where the
    # engine has one for its model (engine/core/turn_head.py); None otherwise
    turn_prob: float | None = None


@dataclass(frozen=True, slots=True)
class StepRecord:
    """One engine step, for metrics: what it ran and how long the step took on the engine thread
    (schedule + forward + the host sync that hands out its tokens)."""

    kind: str  # prefill | decode | verify (a decode step whose rows carried speculative drafts)
    batch: int  # sequences in the step
    seconds: float


@dataclass(frozen=True, slots=True)
class GcPause:
    """One garbage collection of a process: its generation and how long it held the GIL."""

    generation: int
    seconds: float


@dataclass(slots=True)
class EngineStats:
    active: int = 0  # requests queued or running
    submitted: int = 0
    finished: int = 0
    cancelled: int = 0
    tokens: int = 0
    extra: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class EngineLoad:
    """Requests waiting and running and the cache figures, as of the end of a step (the core's
    owner publishes this snapshot; readers on other threads never look into the scheduler)."""

    waiting: int = 0
    running: int = 0
    prefix_hit_ratio: float = 0.0
    spec_acceptance_rate: float = 0.0
    spec_mean_accepted_length: float = 0.0
    kv_blocks_free: int = 0

    def extra(self) -> dict[str, float]:
        return {
            "prefix_hit_ratio": self.prefix_hit_ratio,
            "spec_acceptance_rate": self.spec_acceptance_rate,
            "spec_mean_accepted_length": self.spec_mean_accepted_length,
            "kv_blocks_free": float(self.kv_blocks_free),
        }


def request_problem(request: GenerationRequest) -> str | None:
    """What makes ``request`` unservable (wrong types from an untrusted door, an empty prompt), or
    None. Engines check this when a request is submitted, so a bad request fails alone."""
    if not isinstance(request.request_id, str) or not request.request_id:
        return "request_id must be a non-empty string"
    if (
        isinstance(request.max_new_tokens, bool)
        or not isinstance(request.max_new_tokens, int)
        or request.max_new_tokens < 1
    ):
        return "max_new_tokens must be a positive integer"
    if request.score_end is not False and (problem := _score_problem(request)):
        return problem
    if problem := sampling_problem(request.sampling):
        return problem
    if request.prompt_ids is not None:
        if not request.prompt_ids or not all(
            isinstance(t, int) and t >= 0 for t in request.prompt_ids
        ):
            return "prompt_ids must be non-empty non-negative integers"
        return None
    if not isinstance(request.messages, list) or not request.messages:
        return "messages must be a non-empty list"
    for i, m in enumerate(request.messages):
        if not isinstance(m, ChatMessage) or m.role not in ROLES or not isinstance(m.content, str):
            return f"messages[{i}] must be a ChatMessage with a role in {ROLES} and string content"
        if not all(isinstance(c, ToolCall) for c in m.tool_calls):
            return f"messages[{i}].tool_calls must be ToolCalls"
    if not all(isinstance(t, ToolSpec) for t in request.tools) or not isinstance(
        request.tool_choice, ToolChoice
    ):
        return "tools must be ToolSpecs and tool_choice a ToolChoice"
    names = {t.name for t in request.tools}
    if len(names) != len(request.tools):
        return "tool names must be unique"
    if request.tool_choice.name and request.tool_choice.name not in names:
        return f"tool_choice names {request.tool_choice.name!r}, which is not among the tools"
    return None


def _score_problem(request: GenerationRequest) -> str | None:
    if request.score_end is not True:
        return "score_end must be a boolean"
    if request.prompt_ids is not None or request.tools or request.max_new_tokens != 1:
        return "a score_end request has messages, no prompt_ids, no tools and max_new_tokens 1"
    last = request.messages[-1] if isinstance(request.messages, list) and request.messages else None
    if not isinstance(last, ChatMessage) or last.role != "user":
        return "a score_end request's last message must be the user's"
    return None


def final_event(
    reason: str,
    error: str | None = None,
    index: int = 0,
    prefill_start_ns: int = 0,
    prompt_tokens: int = 0,
) -> TokenEvent:
    """The last event of a request's stream."""
    return TokenEvent(
        index,
        -1,
        "",
        time.perf_counter_ns(),
        prefill_start_ns,
        prompt_tokens,
        finish_reason=reason,
        error=error,
    )


class EndedStream:
    """A stream that was over before it began: one final event (a refused request)."""

    def __init__(self, event: TokenEvent) -> None:
        self._event: TokenEvent | None = event

    def __aiter__(self) -> EndedStream:
        return self

    async def __anext__(self) -> TokenEvent:
        if self._event is None:
            raise StopAsyncIteration
        event, self._event = self._event, None
        return event


BAD_REQUEST = "bad request: "  # an ERROR whose text starts so is the client's input, not a failure


def is_bad_request(error: str | None) -> bool:
    """Whether a final event's ``error`` blames the request (a door answers it as a client
    error: HTTP 400, not 503), rather than the engine."""
    return error is not None and error.startswith(BAD_REQUEST)


def refusal(request: GenerationRequest) -> EndedStream | None:
    """The stream to hand back at once for a request that cannot be served (see
    :func:`request_problem`), or None when it may be submitted."""
    problem = request_problem(request)
    if problem is None:
        return None
    return EndedStream(final_event(FinishReason.ERROR, f"{BAD_REQUEST}{problem}"))


def unscored(request: GenerationRequest) -> EndedStream | None:
    """For an engine that cannot score: the stream that fails a ``score_end`` request, or None."""
    if not request.score_end:
        return None
    return EndedStream(
        final_event(FinishReason.ERROR, f"{BAD_REQUEST}this engine cannot score (score_end)")
    )


class Engine(Protocol):
    """What the server, the session and the metrics may ask of any engine.

    Requests: ``submit`` returns at once; iterating the stream yields TokenEvents in order and ends
    after the one with ``finish_reason`` set. ``cancel`` may be called at any time, from the event
    loop, for a running, queued or finished request; a running request stops within one step and
    frees its state, and its stream ends with ``finish_reason='cancelled'``. Breaking out of the
    iteration early without ``cancel`` leaves the request running: always cancel.

    Health: ``state`` (``healthy`` is ``state is SERVING``) and ``last_failure``. ``on_failure``
    is set by a supervisor and called once, from any thread, when the engine dies (its open
    requests have been or are being failed); ``on_give_up`` is set by the server and called once
    when an engine that rebuilds itself has stopped trying (the server then exits).

    Capability: ``scores``, whether ``score_end`` requests are served (else they fail).

    Telemetry, never blocking: ``stats`` (counters), ``load`` (the last published snapshot, None
    when the engine has none), ``drain_steps`` / ``drain_gc`` (what happened since the last
    call), ``live_requests``, ``pid`` (of the process the engine runs in; 0: this one)."""

    on_failure: Callable[[str], None] | None
    on_give_up: Callable[[str], None] | None

    def submit(self, request: GenerationRequest) -> AsyncIterator[TokenEvent]: ...

    def cancel(self, request_id: str) -> None: ...

    @property
    def state(self) -> EngineState: ...

    @property
    def healthy(self) -> bool: ...

    @property
    def last_failure(self) -> str | None: ...

    @property
    def pid(self) -> int: ...

    def stats(self) -> EngineStats: ...

    def load(self) -> EngineLoad | None: ...

    def drain_steps(self) -> list[StepRecord]: ...

    def drain_gc(self) -> list[GcPause]: ...

    def live_requests(self) -> set[str]: ...

    @property
    def scores(self) -> bool: ...

    def warmup(self) -> None: ...

    def close(self) -> None: ...


class EngineBase(abc.ABC):
    """The :class:`Engine` contract with the defaults of an engine that has no more to say: it
    serves until it fails (``last_failure`` set: FAILED), publishes no load, no steps and no
    collector pauses, runs in this process and needs no warm-up. Subclasses implement the
    requests, the counters and ``close``, and override what they know better."""

    on_failure: Callable[[str], None] | None = None
    on_give_up: Callable[[str], None] | None = None

    @abc.abstractmethod
    def submit(self, request: GenerationRequest) -> AsyncIterator[TokenEvent]: ...

    @abc.abstractmethod
    def cancel(self, request_id: str) -> None: ...

    @abc.abstractmethod
    def stats(self) -> EngineStats: ...

    @abc.abstractmethod
    def close(self) -> None: ...

    @property
    def state(self) -> EngineState:
        return EngineState.SERVING if self.last_failure is None else EngineState.FAILED

    @property
    def healthy(self) -> bool:
        return self.state is EngineState.SERVING

    @property
    def last_failure(self) -> str | None:
        return None

    @property
    def pid(self) -> int:
        return 0

    def load(self) -> EngineLoad | None:
        return None

    def drain_steps(self) -> list[StepRecord]:
        return []

    def drain_gc(self) -> list[GcPause]:
        return []

    def live_requests(self) -> set[str]:
        return set()

    @property
    def scores(self) -> bool:
        """Serves ``score_end`` requests (an end-of-turn score from the model's own
        probabilities); an engine that cannot fails them with an error event."""
        return False

    def warmup(self) -> None:
        return None
