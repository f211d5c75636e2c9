"""VAD cost per tick as sessions grow: ``python -m voicert.bench.vad``.

N sessions each push one 20 ms frame of real speech (the test WAVs, each session at its own offset)
per tick. Side by side, the same ticks scored two ways: each session's windows scored on their own
(one model call per session window: the path before batching) and all sessions' windows of the
tick in one :class:`~voicert.speech.vad.VadBatcher` flush (one call per window position). Prints
the host time per tick (P50 / P95 / P99) and its share of the 20 ms a tick lasts in real time.

``--compare-decisions`` also scores the test WAVs with the sequence model faster-whisper bundles
(the model used before) and prints how many 32 ms windows get a different speech / silence call.
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import os
import time

import numpy as np

from voicert.speech.vad import FRAME, SileroVad, VadBatcher, VadStream

TICK = 320  # 20 ms at 16 kHz


def _speech() -> np.ndarray:
    from voicert.audio.wav import read_wav

    data = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "data")
    clips = [read_wav(p) for p in sorted(glob.glob(os.path.join(data, "*.wav")))]
    x = np.concatenate([c for c, r in clips if r == 16000] or [np.zeros(16000, np.float32)])
    return x.astype(np.float32)


def _pct(xs: list[float]) -> tuple[float, float, float]:
    a = np.array(xs)
    return tuple(float(np.percentile(a, q)) for q in (50, 95, 99))  # type: ignore[return-value]


async def _run(model: SileroVad, n: int, ticks: int, speech: np.ndarray) -> tuple[list, list]:
    offsets = [(i * 7919 * TICK) % (speech.size - TICK * ticks - 1) for i in range(n)]
    alone = [VadStream(model) for _ in range(n)]
    together = [VadStream(model) for _ in range(n)]
    batcher = VadBatcher(model)
    t_alone, t_batched = [], []
    for t in range(ticks):
        frames = [speech[o + t * TICK : o + (t + 1) * TICK] for o in offsets]
        t0 = time.perf_counter_ns()
        ref = [s.push(f) for s, f in zip(alone, frames)]
        t1 = time.perf_counter_ns()
        got = await asyncio.gather(*(s.push_batched(f, batcher) for s, f in zip(together, frames)))
        t2 = time.perf_counter_ns()
        for a, b in zip(ref, got):
            if not np.array_equal(a, b):
                raise AssertionError("batched probabilities differ from per-session ones")
        t_alone.append((t1 - t0) / 1e6)
        t_batched.append((t2 - t1) / 1e6)
    return t_alone, t_batched


def _compare_decisions(model: SileroVad, threshold: float = 0.5) -> str:
    import faster_whisper
    import onnxruntime

    from voicert.audio.wav import read_wav

    path = os.path.join(os.path.dirname(faster_whisper.__file__), "assets", "silero_vad_v6.onnx")
    opts = onnxruntime.SessionOptions()
    opts.log_severity_level = 4
    old = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"], sess_options=opts)
    data = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "data")
    total = differ = 0
    for p in sorted(glob.glob(os.path.join(data, "*.wav"))):
        x, rate = read_wav(p)
        if rate != 16000:
            continue
        n = x.size // FRAME
        w = x[: n * FRAME].reshape(n, FRAME).astype(np.float32)
        tails = np.concatenate([np.zeros((1, 64), np.float32), w[:-1, -64:]])
        ref, _, _ = old.run(
            None,
            {
                "input": np.concatenate([tails, w], 1),
                "h": np.zeros((1, 1, 128), np.float32),
                "c": np.zeros((1, 1, 128), np.float32),
            },
        )
        new = VadStream(model).push(x[: n * FRAME])
        total += n
        differ += int(((ref.reshape(-1) > threshold) != (new > threshold)).sum())
    return (
        f"speech/silence calls that differ from faster-whisper's bundled model: {differ} of "
        f"{total} windows ({100 * differ / max(total, 1):.1f} %)"
    )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sessions", default="1,16,64,128,256")
    ap.add_argument("--ticks", type=int, default=150)
    ap.add_argument("--compare-decisions", action="store_true")
    args = ap.parse_args(argv)
    model, speech = SileroVad(), _speech()
    print(
        "| sessions | per session: P50 / P95 / P99 ms per tick | batched: P50 / P95 / P99 ms "
        "per tick | ratio (P50) | batched, share of a 20 ms tick |"
    )
    print("|---:|---:|---:|---:|---:|")
    for n in (int(s) for s in args.sessions.split(",")):
        a, b = asyncio.run(_run(model, n, args.ticks, speech))
        pa, pb = _pct(a), _pct(b)
        print(
            f"| {n} | {pa[0]:.2f} / {pa[1]:.2f} / {pa[2]:.2f} | {pb[0]:.2f} / {pb[1]:.2f} / "
            f"{pb[2]:.2f} | {pa[0] / max(pb[0], 1e-9):.1f}x | {100 * pb[0] / 20:.0f} % |"
        )
    if args.compare_decisions:
        print()
        print(_compare_decisions(model))


if __name__ == "__main__":
    main()
