"""``python -m loadgen``: run turns of spoken WAVs against a voicert server and report per-stage
latency percentiles (server ``turn.latency`` stages plus client-side end-of-audio -> first token).

Sequential sessions, one turn after another (no overlap), real-time pace by default. Concurrency,
open-loop arrivals, sweeps and plots are built on this in later work."""

from __future__ import annotations

import argparse
import asyncio
import glob
import json
import sys
import time

import numpy as np

from voicert.client import load_for_streaming, stream_audio
from voicert.telemetry.latency import STAGE_NAMES

REPORT_STAGES = ("endpoint_ms", "asr_ms", "queue_ms", "prefill_ms", "first_token_ms", "send_ms",
                 "ttft_ms", "voice_to_first_token_ms")


def percentiles(values: list[float]) -> dict[str, float]:
    a = np.asarray(values, dtype=np.float64)
    return {"p50": float(np.percentile(a, 50)), "p95": float(np.percentile(a, 95)),
            "p99": float(np.percentile(a, 99)), "mean": float(a.mean()), "n": int(a.size)}


def table(rows: dict[str, dict[str, float]]) -> str:
    lines = ["| stage | P50 ms | P95 ms | P99 ms | mean ms | n |", "|---|---:|---:|---:|---:|---:|"]
    for name, s in rows.items():
        lines.append(f"| {name} | {s['p50']:.1f} | {s['p95']:.1f} | {s['p99']:.1f} | "
                     f"{s['mean']:.1f} | {s['n']} |")
    return "\n".join(lines)


async def run(url: str, files: list[str], turns: int, turns_per_session: int,
              realtime: bool) -> dict[str, list[float]]:
    audio = [load_for_streaming(f) for f in files]
    samples: dict[str, list[float]] = {n: [] for n in (*STAGE_NAMES, "client_ttft_ms")}
    done = 0
    while done < turns:
        k = min(turns_per_session, turns - done)
        batch = [audio[(done + i) % len(audio)] for i in range(k)]
        result = await stream_audio(url, batch, realtime=realtime)
        for turn in result.turns:
            for name, value in turn.latency.items():
                samples[name].append(value)
        # client view: the last frame of the spoken audio (not the trailing silence) was sent ->
        # first token received; only meaningful for the one-turn-per-session layout
        if k == 1 and result.turns and result.turns[0].first_token_client_ns:
            samples["client_ttft_ms"].append(
                (result.turns[0].first_token_client_ns - result.audio_end_ns) / 1e6)
        errors = len(result.errors)
        done += k
        print(f"  {done}/{turns} turns, errors={errors}", file=sys.stderr, flush=True)
    return {k: v for k, v in samples.items() if v}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m loadgen")
    ap.add_argument("--url", default="ws://127.0.0.1:8765/v1/stream")
    ap.add_argument("--wav", nargs="+", default=sorted(glob.glob("tests/data/*.wav")))
    ap.add_argument("--turns", type=int, default=20)
    ap.add_argument("--turns-per-session", type=int, default=1)
    ap.add_argument("--fast", action="store_true", help="send audio faster than real time")
    ap.add_argument("--json", help="write raw samples and percentiles here")
    args = ap.parse_args(argv)
    if not args.wav:
        ap.error("no WAV files")
    t0 = time.perf_counter()
    samples = asyncio.run(run(args.url, args.wav, args.turns, args.turns_per_session,
                              not args.fast))
    stats = {n: percentiles(v) for n, v in samples.items()
             if n in (*REPORT_STAGES, "client_ttft_ms")}
    print(table(stats))
    print(f"\n{args.turns} turns in {time.perf_counter() - t0:.1f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"samples": samples, "stats": stats}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
