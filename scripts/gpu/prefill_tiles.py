"""The paged attention kernel's prefill settings swept: ``python3 scripts/gpu/prefill_tiles.py SHAPE``.

For each (query rows per program, partial floats a merge may read) pair, GPU microseconds per call
of our kernel on the prefill cases of ``voicert.bench.attention`` (CUDA graph of 20 calls, P50 of
50 replays). RANDOM K/V; timing only."""

from __future__ import annotations

import sys

import numpy as np
import torch

sys.path.insert(0, ".")
from voicert.bench import attention as bench  # noqa: E402
from voicert.bench.cuda_time import graph_times  # noqa: E402
from voicert.engine import kernels  # noqa: E402

CASES = ["1x20x170", "1x32x600", "1x100x600", "1x128x600", "1x600x600", "4x128x600", "16x64x1024"]


def main() -> None:
    shape = sys.argv[1] if len(sys.argv) > 1 else "llama-1b"
    heads = bench.HEADS[shape]
    settings = [(0, 8192)] + [(r, f) for r in (16, 32, 64) for f in (2048, 8192)]
    print(f"# {shape} prefill attention, our paged kernel, {torch.cuda.get_device_name()}\n")
    print("| rows (0: by the rule), merge floats | " + " | ".join(CASES) + " |")
    print("|---|" + "---:|" * len(CASES))
    pools = {c: bench.make_pool(bench.Case.parse(c), heads, 16, torch.bfloat16, "cuda") for c in CASES}
    refs = {c: bench.reference(p, heads) for c, p in pools.items()}
    for rows, floats in settings:
        kernels._PREFILL_ROWS, kernels._TILE_SPLIT_FLOATS = rows, floats
        cells = []
        for c in CASES:
            fn = bench.backend("triton", pools[c], heads)
            err = (fn().float() - refs[c]).abs().max().item()
            t = float(np.median(graph_times(fn, 20, 50)))
            cells.append(f"{t:.1f}" + ("" if err < 2e-2 else f" (err {err:.0e})"))
        print(f"| {rows}, {floats} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
