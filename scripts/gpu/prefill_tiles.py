"""The paged attention kernel's settings swept:
``python3 scripts/gpu/prefill_tiles.py SHAPE [tiles | keys | decode]``.

``tiles``: per (query rows per program, partial floats a merge may read); ``keys``: per number of
keys a program's inner step takes, at the rule's tiles; ``decode``: per (keys a step, programs
aimed for) on decode and verify cases. GPU microseconds per call of our kernel on cases of
``voicert.bench.attention`` (CUDA graph of 20 calls, P50 of 50 replays). RANDOM K/V; timing
only."""

from __future__ import annotations

import sys

import numpy as np
import torch

sys.path.insert(0, ".")
from voicert.bench import attention as bench
from voicert.bench.cuda_time import graph_times
from voicert.engine.gpu import kernels

CASES = ["1x20x170", "1x32x600", "1x100x600", "1x600x600", "4x128x600", "16x64x1024", "16x128x2048"]
DECODE_CASES = [
    "1x1x170",
    "1x1x600",
    "1x1x1024",
    "1x1x4096",
    "8x1x600",
    "32x1x1024",
    "1x3x600",
    "16x3x1024",
]


def main() -> None:
    shape = sys.argv[1] if len(sys.argv) > 1 else "llama-1b"
    what = sys.argv[2] if len(sys.argv) > 2 else "tiles"
    heads = bench.HEADS[shape]
    cases = CASES
    if what == "tiles":  # (rows, merge floats)
        knobs = ("_PREFILL_ROWS", "_TILE_SPLIT_FLOATS")
        settings = [(0, 8192)] + [(r, f) for r in (16, 32, 64) for f in (2048, 8192)]
    elif what == "keys":  # keys per inner step at the rule's rows (0: the rule, 8192 // head dim)
        knobs = ("_TILE_BLOCK_N",)
        settings = [(0,), (32,), (64,), (128,)]
    else:  # "decode": keys per inner step and programs aimed for, on decode and verify cases
        knobs = ("_DECODE_BLOCK_N", "_SPLIT_TARGET")
        settings = [(b, t) for b in (0, 32, 64, 128) for t in (64, 128, 256)]
        cases = DECODE_CASES
    phase = "decode / verify" if what == "decode" else "prefill"
    print(f"# {shape} {phase} attention, our paged kernel, {torch.cuda.get_device_name()}\n")
    print(f"| {', '.join(knobs)} | " + " | ".join(cases) + " |")
    print("|---|" + "---:|" * len(cases))
    pools = {
        c: bench.make_pool(bench.Case.parse(c), heads, 16, torch.bfloat16, "cuda") for c in cases
    }
    refs = {c: bench.reference(p, heads) for c, p in pools.items()}
    defaults = [getattr(kernels.attention, k) for k in knobs]
    for values in settings:
        for k, v in zip(knobs, values):
            setattr(kernels.attention, k, v)
        cells = []
        for c in cases:
            try:
                fn = bench.backend("triton", pools[c], heads)
                err = (fn().float() - refs[c]).abs().max().item()
                t = float(np.median(graph_times(fn, 20, 50)))
                cells.append(f"{t:.1f}" + ("" if err < 2e-2 else f" (err {err:.0e})"))
            except Exception as exc:  # e.g. a tile too large for shared memory
                cells.append(type(exc).__name__)
        print(f"| {', '.join(map(str, values))} | " + " | ".join(cells) + " |")
    for k, v in zip(knobs, defaults):
        setattr(kernels.attention, k, v)


if __name__ == "__main__":
    main()
