"""Endpoint -> final transcript: ``python -m voicert.bench.asr_latency``.

voicert's path: N callers stream a spoken question at real-time pace at the same moment; each
turn's ``asr_ms`` (endpoint decision -> final transcript on the event loop: the early final decode,
the prioritised batching worker) is read from ``turn.latency``. Baseline, side by side: the same
utterances given to faster-whisper with one ``transcribe()`` call per session at once (threads over
one model with N workers), timed from the call to its transcript - what a per-session pipeline pays
after its endpoint."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from loadgen.caller import Caller, CallerStats
from voicert.client import load_for_streaming

CLIPS = [
    "tests/data/capital_of_france.wav",
    "tests/data/what_about_germany.wav",
    "tests/data/weather_question.wav",
    "tests/data/tell_me_a_joke.wav",
]


def pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs), q)) if xs else float("nan")


async def ours(url: str, clips, sessions: int, rounds: int) -> list[float]:
    out: list[float] = []
    for r in range(rounds):
        stats = CallerStats()
        callers = [
            Caller(
                url,
                clips,
                turns=1,
                think_s=0,
                turn_timeout_s=120,
                concurrency=sessions,
                seed=r * 100 + i,
            )
            for i in range(sessions)
        ]
        stop = time.monotonic() + 600
        await asyncio.gather(*(c.session(stats, stop) for c in callers))
        out += [t.stages["asr_ms"] for t in stats.turns if "asr_ms" in t.stages]
    return out


def baseline(model_dir: str, clips, sessions: int, rounds: int) -> list[float]:
    from faster_whisper import WhisperModel

    model = WhisperModel(model_dir, device="cpu", compute_type="int8", num_workers=sessions)
    audios = [c[0] for c in clips]

    def one(i: int) -> float:
        t0 = time.perf_counter()
        segments, _ = model.transcribe(
            audios[i % len(audios)],
            language="en",
            beam_size=1,
            vad_filter=False,
            without_timestamps=True,
            condition_on_previous_text=False,
        )
        " ".join(s.text for s in segments)
        return (time.perf_counter() - t0) * 1000

    one(0)  # warm up
    out: list[float] = []
    with ThreadPoolExecutor(sessions) as pool:
        for _ in range(rounds):
            out += list(pool.map(one, range(sessions)))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m voicert.bench.asr_latency", description=__doc__)
    ap.add_argument("--url", default="ws://127.0.0.1:8765/v1/stream")
    ap.add_argument("--sessions", default="1,8")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--asr", default="embedded")
    args = ap.parse_args(argv)
    from voicert.speech.asr import resolve_asr_model

    clips = [load_for_streaming(c) for c in CLIPS]
    print(
        "| sessions | voicert endpoint->final P50 ms | P99 ms | per-session faster-whisper P50 ms "
        "| P99 ms | P50 ratio |"
    )
    print("|---:|---:|---:|---:|---:|---:|")
    for n in [int(s) for s in args.sessions.split(",")]:
        a = asyncio.run(ours(args.url, clips, n, args.rounds))
        b = baseline(str(resolve_asr_model(args.asr)), clips, n, args.rounds)
        print(
            f"| {n} | {pct(a, 50):.1f} | {pct(a, 99):.1f} | {pct(b, 50):.1f} | {pct(b, 99):.1f} | "
            f"{pct(b, 50) / pct(a, 50):.1f}x |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
