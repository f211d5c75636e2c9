"""Supervision: the engine the server talks to is rebuilt when it fails.

:class:`SupervisedEngine` implements the :class:`~voicert.core.llm.Engine` interface over an
engine made by a factory (the in-process thread engine or the engine process). When that engine
fails (its thread dies, its process is killed or crashes), it has already ended every open request
with an error; the supervisor then marks itself ``RESTARTING`` (readiness says 503, new requests end
at once with a typed error instead of hanging), closes the dead engine and builds a new one, with
exponential back-off between failed attempts. A request made while it restarts waits for the new
engine (up to ``wait_s``; it can be cancelled meanwhile), so a caller who speaks during a restart
is answered late rather than not at all. More than ``max_restarts`` failures within
``window_s`` is final: the state becomes ``FAILED`` and ``on_give_up`` tells the server, which
exits non-zero rather than serve turns that can never be answered.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from voicert.core.llm import (
    EndedStream,
    Engine,
    EngineLoad,
    EngineState,
    EngineStats,
    FinishReason,
    GcPause,
    GenerationRequest,
    StepRecord,
    TokenEvent,
    final_event,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RestartPolicy:
    max_restarts: int = 5  # failures (of the engine or of a rebuild) allowed within window_s
    window_s: float = 300.0
    backoff_s: float = 0.5  # wait before the first rebuild; doubles after each failed attempt
    max_backoff_s: float = 30.0
    wait_s: float = 30.0  # a request made while the engine restarts waits this long for it


class SupervisedEngine:
    """``build()`` makes a started engine (blocking; it raises if the engine cannot start); its
    ``on_failure`` hook is set here, and it calls it once if it dies. The first build happens here, so a server
    whose engine cannot start at all fails its start-up with that error."""

    def __init__(
        self,
        build: Callable[[], Engine],
        policy: RestartPolicy = RestartPolicy(),
        on_give_up: Callable[[str], None] | None = None,
    ) -> None:
        self._build = build
        self.policy = policy
        self.on_give_up = on_give_up
        self.on_failure: Callable[[str], None] | None = None  # nobody supervises a supervisor
        self.state = EngineState.STARTING
        self.engine = self._attach(build())
        self.state = EngineState.SERVING
        self.restarts = 0
        self.last_failure: str | None = None
        self._failures: collections.deque[float] = collections.deque()
        self._wake = threading.Event()
        self._lock = threading.Lock()  # guards _waiters and _deferred
        self._waiters: set[tuple[asyncio.AbstractEventLoop, asyncio.Future]] = set()
        self._deferred: dict[str, _Deferred] = {}  # requests waiting for a restart
        self._watcher = threading.Thread(
            target=self._watch, name="voicert-engine-supervisor", daemon=True
        )
        self._watcher.start()

    def _attach(self, engine: Engine) -> Engine:
        engine.on_failure = self._on_failure
        return engine

    def _on_failure(self, why: str) -> None:
        """Called by the failed engine (its own thread)."""
        if self.state is EngineState.SERVING:
            self.last_failure = why
            self.state = EngineState.RESTARTING
            log.error("engine failed (%s): restarting", why)
        self._wake.set()

    @property
    def healthy(self) -> bool:
        return self.state is EngineState.SERVING

    # ------------------------------------------------------------ the watcher thread

    def _watch(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            if self.state is EngineState.CLOSED:
                return
            if self.state is EngineState.RESTARTING:
                self._restart()

    def _too_many(self) -> bool:
        now = time.monotonic()
        self._failures.append(now)
        while self._failures and self._failures[0] < now - self.policy.window_s:
            self._failures.popleft()
        return len(self._failures) > self.policy.max_restarts

    def _restart(self) -> None:
        old, backoff = self.engine, self.policy.backoff_s
        try:
            old.close()
        except Exception:  # it is dead already; closing is tidying up
            log.exception("closing the failed engine")
        while self.state is EngineState.RESTARTING:
            if self._too_many():
                self._give_up(
                    f"{len(self._failures)} engine failures within "
                    f"{self.policy.window_s:g} s; last: {self.last_failure}"
                )
                return
            if self._wake.wait(backoff) and self.state is EngineState.CLOSED:
                return
            t0 = time.perf_counter()
            try:
                engine = self._attach(self._build())
            except Exception as exc:
                self.last_failure = f"rebuild failed: {type(exc).__name__}: {exc}"
                log.error("engine %s", self.last_failure)
                backoff = min(backoff * 2, self.policy.max_backoff_s)
                continue
            if self.state is EngineState.CLOSED:
                engine.close()
                return
            self.engine = engine
            self.restarts += 1
            self.state = EngineState.SERVING
            self._notify()
            log.warning(
                "engine restarted in %.1f s (restart %d)", time.perf_counter() - t0, self.restarts
            )

    def _notify(self) -> None:
        """Wake every request waiting for the engine (any thread)."""
        with self._lock:
            waiters, self._waiters = self._waiters, set()
        for loop, fut in waiters:
            try:
                loop.call_soon_threadsafe(_wake, fut)
            except RuntimeError:  # its loop is closed
                pass

    def _give_up(self, why: str) -> None:
        self.state = EngineState.FAILED
        self.last_failure = why
        self._notify()
        log.critical("engine cannot be brought back: %s", why)
        if self.on_give_up is not None:
            self.on_give_up(why)

    # ------------------------------------------------------------ the Engine interface

    def submit(self, request: GenerationRequest) -> AsyncIterator[TokenEvent]:
        """Never raises and never hangs: while the engine restarts the request waits for it (up to
        ``policy.wait_s``); past that, or when the engine is gone for good, the stream ends with
        ``finish_reason='error'`` and an error saying so."""
        if self.state is EngineState.SERVING:
            return self.engine.submit(request)
        if self.state is EngineState.RESTARTING and self.policy.wait_s > 0:
            deferred = _Deferred(self, request)
            with self._lock:
                self._deferred[request.request_id] = deferred
            return deferred
        return EndedStream(self._unavailable())

    def _unavailable(self) -> TokenEvent:
        return final_event(
            FinishReason.ERROR, f"engine unavailable ({self.state.value}): {self.last_failure}"
        )

    async def _wait_up(self, deferred: _Deferred) -> None:
        """Until the engine serves again, fails for good, the request is cancelled, or wait_s."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.policy.wait_s
        while self.state is EngineState.RESTARTING and not deferred.cancelled:
            fut = loop.create_future()
            entry = (loop, fut)
            with self._lock:
                self._waiters.add(entry)
                deferred.waiter = entry
            if self.state is not EngineState.RESTARTING or deferred.cancelled:
                break  # changed while we registered
            try:
                await asyncio.wait_for(fut, max(deadline - loop.time(), 0))
            except TimeoutError:
                break
            finally:
                with self._lock:
                    self._waiters.discard(entry)

    def cancel(self, request_id: str) -> None:
        with self._lock:
            deferred = self._deferred.pop(request_id, None)
            entry = deferred.waiter if deferred is not None else None
        if deferred is None:
            self.engine.cancel(request_id)
            return
        deferred.cancelled = True
        if deferred.inner is not None:  # already handed to the new engine
            self.engine.cancel(request_id)
        elif entry is not None:
            loop, fut = entry
            loop.call_soon_threadsafe(_wake, fut)

    def stats(self) -> EngineStats:
        stats = self.engine.stats()
        stats.extra = {
            **(stats.extra or {}),
            "engine_restarts": float(self.restarts),
            "engine_up": float(self.healthy),
        }
        return stats

    def drain_steps(self) -> list[StepRecord]:
        return self.engine.drain_steps()

    def drain_gc(self) -> list[GcPause]:
        return self.engine.drain_gc()

    @property
    def scores(self) -> bool:
        return self.engine.scores

    def live_requests(self) -> set[str]:
        return self.engine.live_requests()

    def load(self) -> EngineLoad | None:
        return self.engine.load()

    @property
    def pid(self) -> int:
        """The engine process's pid (0 when the engine runs in this process)."""
        return self.engine.pid

    def warmup(self) -> None:
        self.engine.warmup()

    def close(self) -> None:
        self.state = EngineState.CLOSED
        self._notify()
        self._wake.set()
        self.engine.close()
        self._watcher.join(5)


def _wake(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(None)


class _Deferred:
    """A request made while the engine restarts: it is submitted once the engine is back."""

    def __init__(self, sup: SupervisedEngine, request: GenerationRequest) -> None:
        self.sup = sup
        self.request = request
        request.submit_ns = time.perf_counter_ns()
        self.cancelled = False
        self.waiter: tuple | None = None
        self.inner: AsyncIterator[TokenEvent] | None = None

    def __aiter__(self) -> _Deferred:
        return self

    async def __anext__(self) -> TokenEvent:
        if self.inner is None:
            try:
                await self.sup._wait_up(self)
            finally:
                with self.sup._lock:
                    self.sup._deferred.pop(self.request.request_id, None)
            if self.cancelled:
                self.inner = EndedStream(final_event(FinishReason.CANCELLED))
            elif self.sup.state is EngineState.SERVING:
                self.inner = self.sup.engine.submit(self.request)
            else:
                self.inner = EndedStream(self.sup._unavailable())
        return await self.inner.__anext__()
