"""The fast engine in the server process: an :class:`EngineCore` stepped on a thread of its own
(:class:`EngineThread`, also what the engine process runs) and the client the server talks to
(:class:`LLMEngine`, the :class:`~voicert.core.llm.Engine` interface).

Requests reach the thread as typed messages on a queue; each step's records come back keyed by
request id and are routed to their streams with one event-loop wake-up, where they are detokenised.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import copy
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import torch

from voicert.core.chat import ChatMessage
from voicert.core.llm import (
    BAD_REQUEST,
    EndedStream,
    EngineBase,
    EngineLoad,
    EngineStats,
    FinishReason,
    GenerationRequest,
    StepRecord,
    TokenEvent,
    final_event,
    refusal,
)
from voicert.engine.base import RequestLedger, TokenOut, final_out
from voicert.engine.build import build_core
from voicert.engine.clients.detok import IncrementalDetokenizer
from voicert.engine.clients.stream import TokenStream
from voicert.engine.core.engine_core import EngineCore
from voicert.engine.core.guided import Guide, GuideError
from voicert.engine.models.base import Model
from voicert.engine.settings import EngineConfig

log = logging.getLogger(__name__)
__all__ = ["EngineConfig", "EngineLoad", "EngineThread", "LLMEngine"]


@dataclass(frozen=True, slots=True)
class _Add:
    request: GenerationRequest
    guide: Guide | None = None
    built: bool = False  # its guide was built on the grammar thread (``guide``, or ``refused``)
    refused: str | None = None  # why its grammar could not be built
    aborted: bool = False  # aborted while its grammar was being built


@dataclass(frozen=True, slots=True)
class _Abort:
    request_id: str


@dataclass(frozen=True, slots=True)
class _Stop:
    pass


Deliver = Callable[[list[TokenOut]], None]


class EngineThread:
    """Steps an :class:`EngineCore` on a thread of its own, the only thread that touches it.

    ``add`` / ``abort`` / ``stop`` may be called from any thread. Every record the core produces
    goes to ``deliver`` (called on the engine thread, once per step or per batch of arrivals), so a
    request added here always gets a final record: served, refused (its prompt cannot be built),
    failed with its step, or failed with the thread. After each step the thread publishes ``load``
    (a snapshot) for other threads to read. ``on_failure`` (set by the owner) is called once, on the
    engine thread, if the thread dies; every request open then has been failed first.

    A request with tools has its grammar built first, on a grammar thread of its own (~30-60 ms
    for a large tool set the first time, then from the core's cache), so that no step waits for
    it; it joins the queue when its guide is ready.

    ``build`` makes the core (and warms it up, if it should be) on the engine thread, so that one
    thread runs all of its torch work: on the CPU, once two threads have each run torch's
    parallel ops, their OpenMP teams outnumber the cores, every worker sleeps between regions,
    and each region waits to wake one (2 cores, SmolLM2: a decode step 20 -> 33 ms;
    docs/benchmarks.md section 44). The constructor returns once the core is built, and raises
    what ``build`` raised."""

    core: EngineCore  # set on the engine thread, before the constructor returns
    cfg: EngineConfig
    load: EngineLoad  # a snapshot, published after each step

    def __init__(
        self, build: Callable[[], EngineCore], deliver: Deliver, name: str = "voicert-engine"
    ) -> None:
        self.deliver = deliver
        self.failure: str | None = None  # why the thread died, if it did
        self.on_failure: Callable[[str], None] | None = None
        self._inbox: queue.SimpleQueue[_Add | _Abort | _Stop] = queue.SimpleQueue()
        self._gate = threading.Lock()  # a request is queued before the thread dies, or refused
        self._building: dict[str, bool] = {}  # request id -> aborted, while its grammar is built
        self._grammar = concurrent.futures.ThreadPoolExecutor(1, f"{name}-grammar")
        self._built = threading.Event()
        self._build_error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(build,), name=name, daemon=True)
        self._thread.start()
        self._built.wait()
        if self._build_error is not None:
            self._grammar.shutdown(wait=False)
            raise self._build_error

    def add(self, request: GenerationRequest) -> None:
        """Queue a checked request (see :func:`~voicert.core.llm.request_problem`)."""
        with self._gate:
            if self.failure is None:
                if request.tools:
                    self._building[request.request_id] = False
                    self._grammar.submit(self._build, request)
                else:
                    self._inbox.put(_Add(request, None, True))  # no grammar to build
                return
        self._failed_now(request)

    def _build(self, request: GenerationRequest) -> None:
        """Grammar thread: build the request's guide, then queue it (or its refusal)."""
        guide, refused = None, None
        try:
            guide = self.core.guides.for_request(request)
        except GuideError as exc:  # its tool schema cannot be decoded under: the client's fault
            refused = f"{BAD_REQUEST}{exc}"
        except Exception as exc:
            refused = f"request refused: {type(exc).__name__}: {exc}"
        with self._gate:
            aborted = self._building.pop(request.request_id, False)
            if self.failure is None:
                self._inbox.put(_Add(request, guide, True, refused, aborted))
                return
        self._failed_now(request)

    def _failed_now(self, request: GenerationRequest) -> None:
        self.deliver(
            [final_out(request.request_id, FinishReason.ERROR, f"engine failed: {self.failure}")]
        )

    def abort(self, request_id: str) -> None:
        with self._gate:
            if request_id in self._building:  # it is queued when built, and ends there
                self._building[request_id] = True
                return
        self._inbox.put(_Abort(request_id))

    def stop(self, timeout: float = 10) -> None:
        self._inbox.put(_Stop())
        self._thread.join(timeout=timeout)
        self._grammar.shutdown(wait=False, cancel_futures=True)

    @property
    def alive(self) -> bool:
        return self.failure is None and self._thread.is_alive()

    # ------------------------------------------------------------ the engine thread

    def _run(self, build: Callable[[], EngineCore]) -> None:
        try:
            self.core = build()
            self.cfg = self.core.cfg
            self.load = self.core.load()
        except BaseException as exc:  # the constructor raises it
            self._build_error = exc
            return
        finally:
            self._built.set()
        try:
            self._serve()
        except BaseException as exc:  # a bug, not a request: fail everything open, tell the owner
            log.exception("engine thread died")
            self._die(f"{type(exc).__name__}: {exc}")

    def _serve(self) -> None:
        if self.cfg.own_stream and str(self.cfg.device).startswith("cuda"):
            self._use_own_stream()
        core = self.core
        while True:
            block = not core.has_work()
            if not self._drain_inbox(block):
                return
            if block and self.cfg.batch_window_ms > 0:  # idle engine: gather a batch
                deadline = time.perf_counter() + self.cfg.batch_window_ms / 1000
                while (left := deadline - time.perf_counter()) > 0:
                    if not self._drain_inbox(True, timeout=left):
                        return
            try:
                outs = core.step(run_ahead=self._inbox.empty())
            except Exception as exc:  # fail the requests in flight, keep serving
                log.exception("engine step failed")
                outs = core.fail_all(f"engine step failed: {exc}")
            if outs:
                self.deliver(outs)
            self.load = core.load()

    def _drain_inbox(self, block: bool, timeout: float | None = None) -> bool:
        """Apply queued adds and aborts; False when asked to stop."""
        try:
            item = self._inbox.get(block=block, timeout=timeout)
        except queue.Empty:
            return True
        outs: list[TokenOut] = []
        try:
            while True:
                if isinstance(item, _Stop):
                    return False
                if isinstance(item, _Add):
                    self._add(item, outs)
                else:
                    outs.extend(self.core.abort(item.request_id))
                try:
                    item = self._inbox.get_nowait()
                except queue.Empty:
                    return True
        finally:
            if outs:
                self.deliver(outs)

    def _add(self, item: _Add, outs: list[TokenOut]) -> None:
        request = item.request
        if item.aborted:
            outs.append(final_out(request.request_id, FinishReason.CANCELLED))
            return
        if item.refused is not None:
            log.warning("engine: request %s refused: %s", request.request_id, item.refused)
            outs.append(final_out(request.request_id, FinishReason.ERROR, item.refused))
            return
        try:
            self.core.add(request, item.guide, item.built)
        except GuideError as exc:  # its tool schema cannot be decoded under: the client's fault
            log.warning("engine: request %s refused: %s", request.request_id, exc)
            outs.append(final_out(request.request_id, FinishReason.ERROR, f"{BAD_REQUEST}{exc}"))
        except Exception as exc:  # this request is unservable; the others go on
            log.warning("engine: request %s refused: %s", request.request_id, exc)
            outs.append(
                final_out(
                    request.request_id,
                    FinishReason.ERROR,
                    f"request refused: {type(exc).__name__}: {exc}",
                )
            )

    def _die(self, why: str) -> None:
        """The thread is ending abnormally: every open and queued request ends with an error."""
        with self._gate:
            self.failure = why
        error = f"engine failed: {why}"
        if self.on_failure is not None:
            self.on_failure(why)  # first, so that whoever hears of a failed request sees it down
        outs = self.core.fail_all(error)
        while True:
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                break
            if isinstance(item, _Add):
                outs.append(final_out(item.request.request_id, FinishReason.ERROR, error))
        if outs:
            self.deliver(outs)

    def _use_own_stream(self) -> None:
        """Put this (engine) thread on a non-blocking CUDA stream of the highest priority. Other GPU
        users in the process (CTranslate2's Whisper) run on blocking streams, which serialise with
        the legacy default stream: off it, the engine's kernels overlap theirs and go first."""
        torch.cuda.synchronize()  # weights and captured graphs were made on other streams
        # a priority below the range maps to the highest one the device has
        self._stream = torch.cuda.Stream(device=self.cfg.device, priority=-100)
        torch.cuda.set_stream(self._stream)


class _WarmSink:
    """Where a warm-up request's records go (no event loop: the caller blocks)."""

    def __init__(self) -> None:
        self.done = threading.Event()

    def put_threadsafe(self, out: TokenEvent | TokenOut) -> None:
        if out.finish_reason is not None:
            self.done.set()


class LLMEngine(EngineBase):
    """The fast engine in this process: the :class:`~voicert.core.llm.Engine` interface over an
    :class:`EngineThread`. Streams detokenise on the caller's event loop with this client's own
    tokenizer copy (the core's is used by its thread). ``on_failure`` (set by a supervisor) is
    called once, on the engine thread, if that thread ever dies."""

    def __init__(
        self,
        model_dir: str,
        cfg: EngineConfig,
        model: Model | None = None,
        tokenizer=None,
        draft: Model | None = None,
    ) -> None:
        self.ledger = RequestLedger()
        self._lock = threading.Lock()  # guards _sinks (event loop adds, engine thread routes)
        self._sinks: dict[str, TokenStream | _WarmSink] = {}
        self._thread = EngineThread(
            lambda: build_core(model_dir, cfg, model=model, tokenizer=tokenizer, draft=draft),
            self._route,
        )
        self._thread.on_failure = self._failed
        self.core = self._thread.core
        self.cfg = self.core.cfg  # as it applies on the device
        self.tokenizer = copy.deepcopy(self.core.tokenizer)  # the client side's (detokenising)

    # ------------------------------------------------------------ the Engine interface (event loop)

    def submit(self, request: GenerationRequest) -> AsyncIterator[TokenEvent]:
        request.submit_ns = time.perf_counter_ns()
        refused = refusal(request)
        if refused is not None:
            return refused
        if self.last_failure is not None:
            return EndedStream(
                final_event(FinishReason.ERROR, f"engine failed: {self.last_failure}")
            )
        stream = TokenStream(asyncio.get_running_loop(), IncrementalDetokenizer(self.tokenizer))
        self._open(request, stream)
        return stream

    def cancel(self, request_id: str) -> None:
        self._thread.abort(request_id)

    @property
    def last_failure(self) -> str | None:
        """Why the engine thread died (it is not rebuilt here: a supervisor does that)."""
        return self._thread.failure

    def load(self) -> EngineLoad:
        return self._thread.load

    def stats(self) -> EngineStats:
        """Counters and the load the engine thread last published (never blocks, never reads the
        scheduler from this thread)."""
        s = self.ledger.snapshot()
        s.extra = self._thread.load.extra()
        return s

    def drain_steps(self) -> list[StepRecord]:
        """The engine steps since the last call (for metrics; the most recent 8192 at most)."""
        return self.core.drain_steps()

    @property
    def scores(self) -> bool:
        return True

    def live_requests(self) -> set[str]:
        return self.ledger.live()

    def close(self) -> None:
        self._thread.stop()

    def warmup(self) -> None:
        """Run a short request through the whole path once (blocking)."""
        sink = _WarmSink()
        req = GenerationRequest("warmup", [ChatMessage("user", "Hello")], 4)
        req.submit_ns = time.perf_counter_ns()
        self._open(req, sink, count=False)
        sink.done.wait(120)

    # ------------------------------------------------------------ routing

    def _open(self, request: GenerationRequest, sink, count: bool = True) -> None:
        with self._lock:
            self._sinks[request.request_id] = sink
        self.ledger.opened(request.request_id, count=count)
        self._thread.add(request)

    def _route(self, outs: list[TokenOut]) -> None:
        """Engine thread: hand a step's records to their streams (one loop wake-up)."""
        items = []
        with self._lock:
            for out in outs:
                sink = self._sinks.get(out.request_id)
                if out.finish_reason is not None:
                    self._sinks.pop(out.request_id, None)
                    if sink is not None:
                        self.ledger.closed(out.request_id, out.finish_reason, out.index)
                if sink is not None:
                    items.append((sink, out))
        TokenStream.post_all(items)

    def _failed(self, why: str) -> None:
        if self.on_failure is not None:
            self.on_failure(why)
