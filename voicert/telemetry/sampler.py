"""One sampler per server process: the only reader of the engine's and ASR's figures.

Every ``interval_s`` it takes the engine's counters and the records of its steps since the last
sample (and the ASR's batch sizes, the collector's pauses) into :class:`Metrics`, and hands a
:class:`SystemSample` to every subscriber (the dashboards). ``/metrics`` asks for a sample too, so a
scrape is current; the records are taken once, whoever asks, and every dashboard still sees every
step of its tick. Reading never blocks: engines publish their figures, the sampler only copies them.

It also measures the event loop's lag: a probe sleeps ``lag_probe_s`` and records how late it woke
(``voicert_loop_lag_seconds``): the time any callback in this process waits for the loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SystemSample:
    """What the server is doing, once per interval (the dashboards' ``system`` message)."""

    t: float  # wall-clock seconds (for display only)
    sessions: int
    queue_depth: float
    running: float
    steps: int  # engine steps in the interval
    mean_batch: float  # sequences per engine step in the interval
    loop_lag_ms: float  # the largest event-loop lag seen in the interval
    ingest_lag_ms: float = 0.0  # the largest ingest lag of any session's audio in the interval
    ttfts_ms: tuple[float, ...] = ()  # this process's turns' TTFT in the interval (not merged)

    def merged(self, others: list[SystemSample]) -> SystemSample:
        """This worker's sample with the other workers' (``server.workers``): sessions and steps
        add up, the engine's figures are the one shared engine's, the loop lag is the worst."""
        if not others:
            return self
        every = [self, *others]
        steps = sum(s.steps for s in every)
        batch = sum(s.mean_batch * s.steps for s in every)
        return SystemSample(
            self.t,
            sum(s.sessions for s in every),
            self.queue_depth,
            self.running,
            steps,
            batch / steps if steps else 0.0,
            max(s.loop_lag_ms for s in every),
            max(s.ingest_lag_ms for s in every),
            self.ttfts_ms,
        )

    def as_dict(self) -> dict:
        return {
            "type": "system",
            "t": self.t,
            "sessions": self.sessions,
            "queue_depth": self.queue_depth,
            "running": self.running,
            "steps": self.steps,
            "mean_batch": self.mean_batch,
            "loop_lag_ms": self.loop_lag_ms,
            "ingest_lag_ms": self.ingest_lag_ms,
        }


def next_tick(last: float, now: float, interval_s: float) -> float:
    """When the tick after the one due at ``last`` is due, at ``now``: an interval on, so ticks
    keep their phase; but a loop held up past it gets one tick now, not one for each interval
    missed, and a wake-up before its time (a sleep that returned early) never moves the next
    tick more than an interval past now."""
    return min(max(last + interval_s, now), now + interval_s)


class Sampler:
    def __init__(
        self,
        services,
        interval_s: float = 1.0,
        lag_probe_s: float = 0.05,
        process: str = "server",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``clock``: seconds, for how fresh the other workers' samples are (tests pass a fake;
        the ticks and the lag probe run on the event loop's own clock)."""
        self.svc = services
        self.clock = clock
        self.interval_s = interval_s
        self.lag_probe_s = lag_probe_s
        self.process = process
        self.listeners: set[Callable[[SystemSample], None]] = set()
        self.latest: SystemSample | None = None
        self._steps = 0  # engine steps taken since the last tick
        self._batch = 0  # their sequences
        self._max_lag = 0.0
        self._tasks: list[asyncio.Task] = []
        self.publish: Callable[[SystemSample], None] | None = None  # workers: to the others
        self._peers: dict[int, tuple[float, SystemSample]] = {}  # worker -> (when heard, sample)

    def fresh_peers(self) -> list[SystemSample]:
        """The other workers' latest samples, heard within three intervals."""
        now = self.clock()
        return [peer for heard, peer in self._peers.values() if now - heard < 3 * self.interval_s]

    def add_peer_sample(self, worker: int, sample: SystemSample) -> None:
        """Another worker's latest figures (merged into what the dashboards see for a while)."""
        self._peers[worker] = (self.clock(), sample)

    def start(self) -> None:
        """Sample once now (a worker's gauges say what is true from its first scrape on: its
        engine gauge would read "down" until the first tick, and with several workers the
        smallest wins), then every interval."""
        try:
            self.sample()
        except Exception:
            log.exception("sampling failed")
        self._tasks = [asyncio.ensure_future(self._ticks()), asyncio.ensure_future(self._probe())]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def sample(self) -> None:
        """Take the current figures into the metrics (``/metrics`` calls it before a scrape)."""
        m, svc = self.svc.metrics, self.svc
        steps = m.sample_engine(svc.engine)
        self._steps += len(steps)
        self._batch += sum(r.batch for r in steps)
        m.sample_asr(svc.asr)
        if svc.gc_watch is not None:
            m.observe_gc(self.process, svc.gc_watch.drain())

    def tick(self) -> SystemSample:
        """Sample, then publish this interval's summary to every subscriber."""
        self.sample()
        m = self.svc.metrics
        sample = SystemSample(
            time.time(),
            m.active_sessions,
            m.queue_depth._value.get(),
            m.running._value.get(),
            self._steps,
            self._batch / self._steps if self._steps else 0.0,
            round(self._max_lag * 1000, 2),
            round(m.take_ingest_lag(), 2),
            tuple(m.take_ttfts()),
        )
        self._steps = self._batch = 0
        self._max_lag = 0.0
        if self.publish is not None:
            self.publish(sample)
        sample = sample.merged(self.fresh_peers())
        self.latest = sample
        for listener in list(self.listeners):
            try:
                listener(sample)
            except Exception:  # a broken subscriber never stops the sampler
                log.exception("system sample listener failed")
        return sample

    async def _ticks(self) -> None:
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        while True:
            next_at = next_tick(next_at, loop.time(), self.interval_s)
            await asyncio.sleep(next_at - loop.time())
            try:
                self.tick()
            except Exception:
                log.exception("sampling failed")

    async def _probe(self) -> None:
        loop = asyncio.get_running_loop()
        hist = self.svc.metrics.loop_lag.labels(self.process)
        while True:
            due = loop.time() + self.lag_probe_s
            await asyncio.sleep(self.lag_probe_s)
            lag = max(loop.time() - due, 0.0)
            hist.observe(lag)
            self._max_lag = max(self._max_lag, lag)
