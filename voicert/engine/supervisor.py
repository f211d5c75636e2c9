"""Supervision: the engine the server talks to is rebuilt when it fails.

:class:`SupervisedEngine` implements the :class:`~voicert.engine.base.Engine` interface over an
engine made by a factory (the in-process thread engine or the engine process). When that engine
fails (its thread dies, its process is killed or crashes), it has already ended every open request
with an error; the supervisor then marks itself ``RESTARTING`` (readiness says 503, new requests end
at once with a typed error instead of hanging), closes the dead engine and builds a new one, with
exponential back-off between failed attempts. More than ``max_restarts`` failures within
``window_s`` is final: the state becomes ``FAILED`` and ``on_give_up`` tells the server, which
exits non-zero rather than serve turns that can never be answered.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from dataclasses import dataclass
from typing import AsyncIterator, Callable

from voicert.engine.base import (EndedStream, EngineState, EngineStats, FinishReason,
                                 GenerationRequest, TokenEvent, final_event)

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RestartPolicy:
    max_restarts: int = 5  # failures (of the engine or of a rebuild) allowed within window_s
    window_s: float = 300.0
    backoff_s: float = 0.5  # wait before the first rebuild; doubles after each failed attempt
    max_backoff_s: float = 30.0


class SupervisedEngine:
    """``build()`` makes a started engine (blocking; it raises if the engine cannot start) that has
    an ``on_failure`` attribute it calls once if it dies. The first build happens here, so a server
    whose engine cannot start at all fails its start-up with that error."""

    def __init__(self, build: Callable[[], object], policy: RestartPolicy = RestartPolicy(),
                 on_give_up: Callable[[str], None] | None = None) -> None:
        self._build = build
        self.policy = policy
        self.on_give_up = on_give_up
        self.state = EngineState.STARTING
        self.engine = self._attach(build())
        self.state = EngineState.SERVING
        self.restarts = 0
        self.last_failure: str | None = None
        self._failures: collections.deque[float] = collections.deque()
        self._wake = threading.Event()
        self._watcher = threading.Thread(target=self._watch, name="voicert-engine-supervisor",
                                         daemon=True)
        self._watcher.start()

    def _attach(self, engine):
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
                self._give_up(f"{len(self._failures)} engine failures within "
                              f"{self.policy.window_s:g} s; last: {self.last_failure}")
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
            log.warning("engine restarted in %.1f s (restart %d)", time.perf_counter() - t0,
                        self.restarts)

    def _give_up(self, why: str) -> None:
        self.state = EngineState.FAILED
        self.last_failure = why
        log.critical("engine cannot be brought back: %s", why)
        if self.on_give_up is not None:
            self.on_give_up(why)

    # ------------------------------------------------------------ the Engine interface

    def submit(self, request: GenerationRequest) -> AsyncIterator[TokenEvent]:
        """Never raises and never hangs: while the engine is down the stream ends at once with
        ``finish_reason='error'`` and an error saying so."""
        if self.state is not EngineState.SERVING:
            return EndedStream(final_event(FinishReason.ERROR,
                                           f"engine unavailable ({self.state.value}): "
                                           f"{self.last_failure}"))
        return self.engine.submit(request)

    def cancel(self, request_id: str) -> None:
        self.engine.cancel(request_id)

    def stats(self) -> EngineStats:
        stats = self.engine.stats()
        stats.extra = {**(stats.extra or {}), "engine_restarts": float(self.restarts),
                       "engine_up": float(self.healthy)}
        return stats

    def drain_steps(self):
        drain = getattr(self.engine, "drain_steps", None)
        return drain() if drain is not None else []

    def drain_gc(self):
        drain = getattr(self.engine, "drain_gc", None)
        return drain() if drain is not None else []

    def live_requests(self) -> set[str]:
        return self.engine.live_requests()

    @property
    def load(self):
        """(waiting, running) as the engine last published them, or None if it does not."""
        engine = self.engine
        if hasattr(engine, "queue_depth"):
            return engine.queue_depth, engine.running
        load = getattr(engine, "load", None)
        return None if load is None else (load.waiting, load.running)

    @property
    def pid(self) -> int:
        """The engine process's pid (0 when the engine runs in this process)."""
        return getattr(self.engine, "pid", 0)

    def warmup(self) -> None:
        self.engine.warmup()

    def kill(self) -> None:
        """Kill the engine process (chaos checks); only for an engine in a process."""
        self.engine.kill()

    def close(self) -> None:
        self.state = EngineState.CLOSED
        self._wake.set()
        self.engine.close()
        self._watcher.join(5)
