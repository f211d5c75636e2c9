"""How many partial floats the paged attention kernel's merge may read in one load, for decode and
verify steps: ``python3 scripts/gpu/attn_merge.py SHAPE``.

Per setting of ``kernels._MERGE_FLOATS`` (0: splits bounded by ``_MAX_SPLITS`` only), GPU
microseconds per call of our kernel on decode and verify cases of ``voicert.bench.attention``
(CUDA graph of 20 calls, P50 of 50 replays). RANDOM K/V; timing only."""

from __future__ import annotations

import sys

import numpy as np
import torch

sys.path.insert(0, ".")
from voicert.bench import attention as bench  # noqa: E402
from voicert.bench.cuda_time import graph_times  # noqa: E402
from voicert.engine import kernels  # noqa: E402

CASES = ["1x1x170", "1x1x600", "1x1x1024", "1x1x4096", "8x1x600", "32x1x1024", "1x3x600",
         "16x3x1024"]


def main() -> None:
    shape = sys.argv[1] if len(sys.argv) > 1 else "llama-1b"
    heads = bench.HEADS[shape]
    print(f"# {shape} decode / verify attention, our paged kernel, {torch.cuda.get_device_name()}\n")
    print("| merge floats | " + " | ".join(CASES) + " |")
    print("|---|" + "---:|" * len(CASES))
    pools = {c: bench.make_pool(bench.Case.parse(c), heads, 16, torch.bfloat16, "cuda") for c in CASES}
    refs = {c: bench.reference(p, heads) for c, p in pools.items()}
    for floats in (0, 16384, 8192, 4096, 2048):
        kernels._MERGE_FLOATS = floats
        cells = []
        for c in CASES:
            fn = bench.backend("triton", pools[c], heads)
            err = (fn().float() - refs[c]).abs().max().item()
            t = float(np.median(graph_times(fn, 20, 50)))
            cells.append(f"{t:.1f}" + ("" if err < 2e-2 else f" (err {err:.0e})"))
        print(f"| {floats} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
