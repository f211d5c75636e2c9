"""Load modes: closed loop (N callers, each starting a new session when one ends), open loop
(sessions arrive as a Poisson process), and a sweep over closed-loop concurrency levels."""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field

import numpy as np

from loadgen.caller import MAX_VALID_SLIP_MS, Caller, CallerStats, voice_end
from loadgen.probe import LevelProbe, metrics_url
from loadgen.report import misses
from voicert.protocol import native as p


@dataclass
class LoadSpec:
    url: str
    clips: list[tuple[np.ndarray, int]]
    duration_s: float = 30.0
    ramp_s: float = 2.0
    turns: int = 3  # turns per session
    think_s: float = 1.0  # mean pause between turns (uniform jitter +-50 %)
    turn_timeout_s: float = 30.0
    seed: int = 0
    max_turns: int = 0  # stop once this many turns are done (0: run for the duration)
    output_audio: p.OutputAudio | None = None  # ask for spoken replies (time to first audio)
    procs: int = 1  # closed loop: load generator processes the callers are split over
    server_pid: int | None = None  # the server's pid on this machine: its CPU use per level
    voice_ends: list[int] = field(default_factory=list)  # each clip's last voiced sample + 1

    def __post_init__(self) -> None:
        if not self.voice_ends:  # once per clip, here, not per caller
            self.voice_ends = [voice_end(x, rate) for x, rate in self.clips]


async def closed_loop(spec: LoadSpec, callers: int) -> CallerStats:
    """``callers`` concurrent callers, started evenly over the ramp, each running sessions back to
    back until the duration ends. Bounded: every session stops at the deadline. With
    ``spec.procs`` > 1 the callers are split over that many processes (one asyncio loop each), so
    that the load generator keeps real time with many sessions."""
    if spec.procs > 1 and callers > 1:
        return await _closed_loop_procs(spec, callers)
    return await _callers(spec, callers, range(callers), time.monotonic())


async def _callers(spec: LoadSpec, total: int, indices: range, start: float) -> CallerStats:
    """Callers ``indices`` of ``total`` (ramp offsets and seeds by global index) from ``start``."""
    stats = CallerStats()
    stop_at = start + spec.ramp_s + spec.duration_s

    async def one(i: int) -> None:
        await asyncio.sleep(max(0.0, start + spec.ramp_s * i / max(total, 1) - time.monotonic()))
        caller = Caller(
            spec.url,
            spec.clips,
            turns=spec.turns,
            think_s=spec.think_s,
            turn_timeout_s=spec.turn_timeout_s,
            concurrency=total,
            seed=spec.seed * 1000 + i,
            output_audio=spec.output_audio,
            voice_ends=spec.voice_ends,
        )
        while time.monotonic() < stop_at and not (
            spec.max_turns and len(stats.turns) >= spec.max_turns
        ):
            await caller.session(stats, stop_at, spec.max_turns)

    await asyncio.gather(*(one(i) for i in indices))
    return stats


def _shard(spec: LoadSpec, total: int, lo: int, hi: int, start_wall: float) -> CallerStats:
    """A load generator process: callers lo..hi-1, starting at the shared wall-clock instant
    (wall time is used only to line the processes up; every latency is monotonic)."""
    start = time.monotonic() + max(0.0, start_wall - time.time())
    return asyncio.run(_callers(spec, total, range(lo, hi), start))


async def _closed_loop_procs(spec: LoadSpec, callers: int) -> CallerStats:
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    procs = min(spec.procs, callers)
    bounds = [callers * k // procs for k in range(procs + 1)]
    start_wall = time.time() + 2.0  # time for the processes to start and import
    loop = asyncio.get_running_loop()
    with ProcessPoolExecutor(procs, mp_context=mp.get_context("spawn")) as pool:
        parts = await asyncio.gather(
            *(
                loop.run_in_executor(
                    pool, _shard, spec, callers, bounds[k], bounds[k + 1], start_wall
                )
                for k in range(procs)
            )
        )
    merged = CallerStats()
    for part in parts:
        merged.merge(part)
    return merged


async def open_loop(spec: LoadSpec, sessions_per_s: float, max_sessions: int = 1000) -> CallerStats:
    """New sessions arrive as a Poisson process of rate ``sessions_per_s`` for the duration; each
    runs its turns. The concurrency label of a turn is the number of sessions open at its start."""
    stats = CallerStats()
    rng = random.Random(spec.seed)
    stop_at = time.monotonic() + spec.duration_s
    open_now = 0
    tasks = []

    async def one(i: int) -> None:
        nonlocal open_now
        open_now += 1
        caller = Caller(
            spec.url,
            spec.clips,
            turns=spec.turns,
            think_s=spec.think_s,
            turn_timeout_s=spec.turn_timeout_s,
            concurrency=open_now,
            seed=i,
            output_audio=spec.output_audio,
            voice_ends=spec.voice_ends,
        )
        try:
            await caller.session(stats, stop_at + spec.turn_timeout_s)
        finally:
            open_now -= 1

    i = 0
    while time.monotonic() < stop_at and i < max_sessions:
        tasks.append(asyncio.create_task(one(i)))
        i += 1
        await asyncio.sleep(rng.expovariate(sessions_per_s))
    await asyncio.gather(*tasks)
    return stats


async def sweep(
    spec: LoadSpec,
    levels: list[int],
    budget_ms: float,
    on_level=None,
    max_slip_ms: float = MAX_VALID_SLIP_MS,
) -> tuple[dict[int, CallerStats], int | None]:
    """Closed loop at each level in turn. Returns the stats per level and the largest level that
    held the budget (:func:`loadgen.report.holds`; None if none did)."""
    results: dict[int, CallerStats] = {}
    best = None
    probe = LevelProbe(metrics_url(spec.url), spec.server_pid)
    for n in levels:
        await asyncio.to_thread(probe.begin)
        stats = await closed_loop(spec, n)
        stats.server = await asyncio.to_thread(probe.end)
        results[n] = stats
        held = not misses(stats, budget_ms, max_slip_ms)
        if on_level:
            on_level(n, stats, held)
        if held:
            best = n
    return results, best
