"""Prometheus metrics and the recent-turn feed for dashboards.

One :class:`Metrics` per server, with its own registry (so several servers in one process, as in
the tests, never collide). Turn latencies arrive as :class:`TurnRecord`s; engine and ASR figures are
sampled from their stats when ``/metrics`` is scraped or the dashboard ticks.

With front-end workers (``server.workers``) each worker process writes its figures to one shared
directory (prometheus_client's multiprocess mode, :func:`use_multiprocess_dir`) and any worker's
``/metrics`` shows all of them: counters and histograms summed, session gauges summed over live
workers, engine gauges (the one shared engine, seen by every worker) the largest live value. The
recent-turn feed gets the other workers' turns through the primary (:meth:`Metrics.add_peer_turn`).
"""

from __future__ import annotations

import collections
import logging
import os
from collections.abc import Callable

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    generate_latest,
    values,
)
from prometheus_client.multiprocess import MultiProcessCollector

from voicert.core.llm import Engine, GcPause, StepRecord
from voicert.core.speech import Asr
from voicert.telemetry.latency import STAGE_NAMES, TurnRecord

log = logging.getLogger(__name__)
CONTENT_TYPE = CONTENT_TYPE_LATEST


MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


def use_multiprocess_dir(path: str) -> None:
    """Make this process's metrics live in ``path`` (shared with the other workers). A worker
    calls it once, before it makes its :class:`Metrics`."""
    os.environ[MULTIPROC_ENV] = path
    values.ValueClass = values.get_value_class()  # prometheus_client reads the variable on import


def latency_buckets(budget_ms: float) -> list[float]:
    """Seconds. Coarse far from the budget, 1 ms steps within 10 ms of it."""
    ms = {
        0.5,
        1,
        2,
        3,
        5,
        7.5,
        10,
        15,
        20,
        30,
        40,
        50,
        60,
        70,
        80,
        150,
        200,
        300,
        400,
        500,
        750,
        1000,
        1500,
        2000,
        3000,
        5000,
        10000,
        30000,
    }
    ms |= {budget_ms + d for d in range(-10, 11) if budget_ms + d > 0}
    return sorted(m / 1000 for m in ms)


class Metrics:
    def __init__(self, budget_ms: float = 100.0, recent: int = 200) -> None:
        self.budget_ms = budget_ms
        self.multiprocess_dir = os.environ.get(MULTIPROC_ENV)  # set: one of several workers
        r = self.registry = CollectorRegistry()
        buckets = latency_buckets(budget_ms)
        self.stage = Histogram(
            "voicert_stage_latency_seconds",
            "Per-stage turn latency (see docs/protocol.md for each interval)",
            ["stage"],
            buckets=buckets,
            registry=r,
        )
        self.ttft = Histogram(
            "voicert_ttft_seconds",
            "Endpoint decision -> first token on the wire",
            buckets=buckets,
            registry=r,
        )
        self.v2ft = Histogram(
            "voicert_voice_to_first_token_seconds",
            "Last voiced audio -> first token on the wire",
            buckets=buckets,
            registry=r,
        )
        self.budget = Gauge(
            "voicert_ttft_budget_seconds",
            "The configured TTFT budget (telemetry.budget_ms): turns over it are flagged",
            registry=r,
            multiprocess_mode="livemax",
        )
        self.budget.set(budget_ms / 1000)
        self.ingest_lag = Gauge(
            "voicert_ingest_lag_max_seconds",
            "The most any session's audio frame was handled after the caller made it (its ingest "
            "lag: audio/clock.py), over the last sampling interval",
            registry=r,
            multiprocess_mode="livemax",
        )
        self._ingest_max_ns = 0  # since the last take_ingest_lag
        self._ttfts: list[float] = []  # this process's turns' TTFT (ms) since the last take_ttfts
        self.admission_closed = Gauge(
            "voicert_admission_closed",
            "1 while new sessions are refused because the server is behind (server.admission)",
            registry=r,
            multiprocess_mode="livemax",
        )
        self.turns = Counter("voicert_turns_total", "Finished turns", ["finish_reason"], registry=r)
        self.over_budget = Counter(
            "voicert_turns_over_budget_total", "Turns whose TTFT exceeded the budget", registry=r
        )
        self.errors = Counter(
            "voicert_errors_total", "Error events sent, by code", ["code"], registry=r
        )
        self.verdicts = Counter(
            "voicert_turn_verdicts_total",
            "Semantic end-of-turn judgements of a pause, by verdict",
            ["verdict"],
            registry=r,
        )
        self.opinions_late = Counter(
            "voicert_turn_opinions_late_total",
            "Pauses judged at turn.decide_by_ms without an opinion that had not come in, by "
            "opinion (audio: the turn-completion model; text: the early transcript; score: the "
            "LLM's end-of-turn score)",
            ["opinion"],
            registry=r,
        )
        self.judge_seconds = Histogram(
            "voicert_turn_judge_seconds",
            "Turn-completion model: one judgement, queue included",
            buckets=[0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2],
            registry=r,
        )
        self.score_seconds = Histogram(
            "voicert_turn_text_score_seconds",
            "(hazard) The LLM's end-of-turn scores of one early transcript, queue included",
            buckets=[0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2],
            registry=r,
        )
        self.overlaps = Counter(
            "voicert_speech_over_reply_total",
            "Short speech over a reply, screened: backchannel (let go) or interruption",
            ["outcome"],
            registry=r,
        )
        self.tool_calls = Counter(
            "voicert_tool_calls_total",
            "Server-side tool calls run, by outcome (ok | error)",
            ["outcome"],
            registry=r,
        )
        self.tool_seconds = Histogram(
            "voicert_tool_seconds",
            "Server-side tool calls: one call",
            buckets=[0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30],
            registry=r,
        )
        self.sessions = Gauge(
            "voicert_active_sessions",
            "Sessions started and not ended",
            registry=r,
            multiprocess_mode="livesum",
        )
        self.queue_depth = Gauge(
            "voicert_engine_queue_depth",
            "Requests waiting for the engine",
            registry=r,
            multiprocess_mode="livemax",
        )
        self.running = Gauge(
            "voicert_engine_running",
            "Requests the engine is generating",
            registry=r,
            multiprocess_mode="livemax",
        )
        self.batch = Histogram(
            "voicert_engine_batch_size",
            "Sequences per engine step",
            buckets=[1, 2, 4, 8, 16, 32, 64, 128, 256],
            registry=r,
        )
        self.step = Histogram(
            "voicert_engine_step_seconds",
            "Engine step time on the engine thread (schedule, forward, sync)",
            ["kind"],
            buckets=[
                0.0005,
                0.001,
                0.002,
                0.004,
                0.008,
                0.016,
                0.032,
                0.064,
                0.128,
                0.256,
                0.512,
                1.024,
            ],
            registry=r,
        )
        self.gc_pause = Histogram(
            "voicert_gc_pause_seconds",
            "Garbage-collector pauses, by process and generation",
            ["process", "generation"],
            buckets=[0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5],
            registry=r,
        )
        self.prefix_hit = Gauge(
            "voicert_prefix_cache_hit_ratio",
            "Prompt tokens served from the prefix cache / looked up",
            registry=r,
            multiprocess_mode="livemax",
        )
        self.spec_accept = Gauge(
            "voicert_spec_acceptance_rate",
            "Accepted / proposed speculative drafts",
            registry=r,
            multiprocess_mode="livemax",
        )
        self.engine_up = Gauge(
            "voicert_engine_up",
            "1 while the LLM engine serves; 0 while it is down or restarting",
            registry=r,
            multiprocess_mode="livemin",
        )
        self.engine_restarts = Gauge(
            "voicert_engine_restarts",
            "Times the engine was rebuilt after a failure",
            registry=r,
            multiprocess_mode="livemax",
        )
        self.engine_pid = Gauge(
            "voicert_engine_pid",
            "The engine process's pid (0: in the server process)",
            registry=r,
            multiprocess_mode="livemax",
        )
        self.loop_lag = Histogram(
            "voicert_loop_lag_seconds",
            "How late a timer on the process's event loop fires (the wait "
            "any callback has for the loop)",
            ["process"],
            buckets=[0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1],
            registry=r,
        )
        if self.multiprocess_dir is None:  # (with workers: per process, so left out)
            ProcessCollector(registry=r)  # process_resident_memory_bytes, process_open_fds, ...
        self.asr_batch = Histogram(
            "voicert_asr_batch_size",
            "Utterances per ASR decode",
            buckets=[1, 2, 4, 8, 16, 32, 64],
            registry=r,
        )
        self.recent: collections.deque[TurnRecord] = collections.deque(maxlen=recent)
        self.listeners: set[Callable[[TurnRecord], None]] = set()
        self.publish: Callable[[TurnRecord], None] | None = None  # workers: to the other workers
        self.active_sessions = 0

    def note_ingest_lag(self, lag_ns: int) -> None:
        """A frame's ingest lag (every frame of every session: a comparison, no more)."""
        if lag_ns > self._ingest_max_ns:
            self._ingest_max_ns = lag_ns

    def take_ingest_lag(self) -> float:
        """The largest ingest lag (ms) noted since the last take; sets the gauge."""
        lag_ms, self._ingest_max_ns = self._ingest_max_ns / 1e6, 0
        self.ingest_lag.set(lag_ms / 1000)
        return lag_ms

    def take_ttfts(self) -> list[float]:
        """The TTFTs (ms) of the turns this process finished since the last take."""
        taken, self._ttfts = self._ttfts, []
        return taken

    def observe_turn(self, rec: TurnRecord) -> None:
        for name in STAGE_NAMES:
            if name in rec.stages and name not in ("ttft_ms", "voice_to_first_token_ms"):
                self.stage.labels(name.removesuffix("_ms")).observe(rec.stages[name] / 1000)
        if rec.ttft_ms is not None:
            self.ttft.observe(rec.ttft_ms / 1000)
            if len(self._ttfts) < 10_000:  # (taken each sampling interval)
                self._ttfts.append(rec.ttft_ms)
        if "voice_to_first_token_ms" in rec.stages:
            self.v2ft.observe(rec.stages["voice_to_first_token_ms"] / 1000)
        self.turns.labels(rec.finish_reason).inc()
        if rec.over_budget:
            self.over_budget.inc()
        self._show(rec)
        if self.publish is not None:
            self.publish(rec)

    def add_peer_turn(self, rec: TurnRecord) -> None:
        """Another worker's finished turn: into the recent-turn feed (its numbers are already in
        the shared metrics)."""
        self._show(rec)

    def _show(self, rec: TurnRecord) -> None:
        self.recent.append(rec)
        for listener in list(self.listeners):
            try:
                listener(rec)
            except Exception:  # a broken dashboard feed must never break a turn
                log.exception("turn listener failed")

    def session_started(self) -> None:
        self.active_sessions += 1
        self.sessions.set(self.active_sessions)

    def session_ended(self) -> None:
        self.active_sessions -= 1
        self.sessions.set(self.active_sessions)

    def observe_error(self, code: str) -> None:
        self.errors.labels(code).inc()

    def sample_engine(self, engine: Engine) -> list[StepRecord]:
        """Pull the engine's current figures. Returns the engine steps since the last sample."""
        stats = engine.stats()
        extra = stats.extra or {}
        load = engine.load()  # as the engine last published it
        if load is not None:
            self.queue_depth.set(load.waiting)
            self.running.set(load.running)
        else:
            self.running.set(stats.active)
        self.observe_gc("engine", engine.drain_gc())  # the engine process's own collector
        steps = engine.drain_steps()
        for rec in steps:
            self.batch.observe(rec.batch)
            self.step.labels(rec.kind).observe(rec.seconds)
        self.engine_up.set(extra.get("engine_up", 1.0))
        self.engine_restarts.set(extra.get("engine_restarts", 0.0))
        self.engine_pid.set(engine.pid)
        if "prefix_hit_ratio" in extra:
            self.prefix_hit.set(extra["prefix_hit_ratio"])
        if "spec_acceptance_rate" in extra:
            self.spec_accept.set(extra["spec_acceptance_rate"])
        return steps

    def observe_gc(self, process: str, pauses: list[GcPause]) -> None:
        for p in pauses:
            self.gc_pause.labels(process, str(p.generation)).observe(p.seconds)

    def sample_asr(self, asr: Asr) -> None:
        for size in asr.drain_batch_sizes():
            self.asr_batch.observe(size)

    def exposition(self) -> bytes:
        """The text format: this registry's, or every worker's when there are several."""
        if self.multiprocess_dir is None:
            return generate_latest(self.registry)
        merged = CollectorRegistry()
        MultiProcessCollector(merged, path=self.multiprocess_dir)
        return generate_latest(merged)
