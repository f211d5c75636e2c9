"""The engine bench's measurements, the same for every engine it runs (ours, or vLLM in
bench/vllm_side.py): cached-prefix TTFT, and TPOT and tokens/s at several concurrent streams,
each figure under one row name."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import numpy as np


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


# (prompt ids, new tokens) -> (the receive time of each token in ns, the submit time in ns): one
# streamed greedy request to the engine under test (ours, or vLLM in bench/vllm_side.py)
StreamFn = Callable[[list[int], int], Awaitable[tuple[list[int], int]]]
TokensFn = Callable[[int], list[int]]  # n -> n random prompt token ids


async def ttft_cached(
    stream: StreamFn, tokens: TokensFn, reps: int, cached: int = 500, new: int = 100
) -> list[float]:
    """TTFT in ms of prompts whose first ``cached`` tokens an earlier request left in the cache."""
    prefix = tokens(cached)
    await stream(prefix + tokens(new), 1)
    out = []
    for _ in range(reps):
        times, t0 = await stream(prefix + tokens(new), 1)
        out.append((times[0] - t0) / 1e6)
    return out


async def concurrent(
    stream: StreamFn, prompts: list[list[int]], new: int
) -> tuple[float, list[float], list[float]]:
    """All prompts at once: (tokens/s, each stream's TPOT in ms, each stream's TPOT once every
    stream had its first token: decode only, no newcomer's prefill interleaved)."""
    t0 = time.perf_counter()
    results = await asyncio.gather(*(stream(p, new) for p in prompts))
    wall = time.perf_counter() - t0
    tpots = [(t[-1] - t[0]) / 1e6 / (len(t) - 1) for t, _ in results]
    all_started = max(t[0] for t, _ in results)
    steady = []
    for t, _ in results:
        after = [x for x in t if x >= all_started]
        if len(after) > 1:
            steady.append((after[-1] - after[0]) / 1e6 / (len(after) - 1))
    return len(prompts) * new / wall, tpots, steady


WARM_TOKENS = 4  # new tokens a stream of the untimed run before each stream count's timed one
TTFT_600 = "TTFT, 600-token prompt, 500 cached"
TTFT_TURN = "TTFT, 20-token turn after a cached 150-token system prompt (P50)"


def tpot_decode(n: int) -> str:
    return f"TPOT per stream, {n} streams, decode only (P50)"


def tpot_all(n: int) -> str:
    return f"TPOT per stream, {n} streams, incl. others' prefill (P50)"


def tokens_per_s(n: int) -> str:
    return f"tokens/s, {n} streams"


async def measure(
    stream: StreamFn, tokens: TokensFn, reps: int, streams: list[int], new: int, prompt_tokens: int
) -> dict[str, float]:
    """The bench's figures of one engine, by row name (the same names for every engine)."""
    out: dict[str, float] = {}
    t = await ttft_cached(stream, tokens, reps)
    out[TTFT_600 + " (P50)"], out[TTFT_600 + " (P99)"] = pct(t, 50), pct(t, 99)
    out[TTFT_TURN] = pct(await ttft_cached(stream, tokens, reps, cached=150, new=20), 50)
    for n in streams:
        # Warm at the full count: steps of n rows (their prefills and decode) compile what they
        # need before the timed run. Warmed at two, the first process on a machine read 2.01 ms
        # at 64 streams where the next, the same code, read 1.68 (1B bf16, H200; section 73).
        await concurrent(stream, [tokens(prompt_tokens) for _ in range(n)], WARM_TOKENS)
        tps, tpots, steady = await concurrent(
            stream, [tokens(prompt_tokens) for _ in range(n)], new
        )
        out[tpot_decode(n)] = pct(steady, 50) if steady else pct(tpots, 50)
        out[tpot_all(n)] = pct(tpots, 50)
        out[tokens_per_s(n)] = tps
    return out
