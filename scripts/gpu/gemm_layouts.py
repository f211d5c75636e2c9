"""Which weight layout and BLAS library gives the layer GEMMs of a decode or prefill step their
best rate: ``python3 scripts/gpu/gemm_layouts.py [1b|8b] [rows,...]``.

Per shape and row count: GPU microseconds per call (CUDA graph of ``COPIES`` calls, each on its own
copy of the weight so that L2 holds none of them, median of 20 replays) and the weight-read rate, for
- ``linear``: ``F.linear(x, W)``, W [N, K] (what the engine runs);
- ``mm_kn``: ``x @ Wt``, Wt [K, N] contiguous;
- ``lt``: ``F.linear`` with torch's preferred BLAS library set to cuBLASLt.
RANDOM WEIGHTS; timing only."""

from __future__ import annotations

import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, ".")
from voicert.bench.cuda_time import graph_times

SHAPES = {
    "1b": {
        "qkv": (3072, 2048),
        "o": (2048, 2048),
        "gate_up": (16384, 2048),
        "down": (2048, 8192),
        "lm_head": (128256, 2048),
    },
    "8b": {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)},
}


def time_us(fn_for, weights, x) -> float:
    i = [0]

    def call():
        fn_for(x, weights[i[0] % len(weights)])
        i[0] += 1

    return float(np.median(graph_times(call, len(weights), 20)))


def main() -> None:
    which = sys.argv[1] if len(sys.argv) > 1 else "1b"
    rows = [int(r) for r in (sys.argv[2] if len(sys.argv) > 2 else "1,8,32,128").split(",")]
    dev, dt = "cuda", torch.bfloat16
    print(f"# {which} layer GEMMs, {torch.cuda.get_device_name()}, bf16, RANDOM WEIGHTS\n")
    print("| shape (N x K) | rows | linear us (GB/s) | mm_kn us (GB/s) | lt us (GB/s) |")
    print("|---|---:|---:|---:|---:|")
    for name, (n, k) in SHAPES[which].items():
        nbytes = n * k * 2
        copies = max(2, min(20, (400 << 20) // nbytes + 1))
        w_nk = [torch.randn(n, k, device=dev, dtype=dt) * 0.02 for _ in range(copies)]
        w_kn = [w.t().contiguous() for w in w_nk]
        for m in rows:
            x = torch.randn(m, k, device=dev, dtype=dt)
            torch.backends.cuda.preferred_blas_library("cublas")
            a = time_us(lambda x, w: F.linear(x, w), w_nk, x)
            b = time_us(lambda x, w: x @ w, w_kn, x)
            torch.backends.cuda.preferred_blas_library("cublaslt")
            c = time_us(lambda x, w: F.linear(x, w), w_nk, x)
            torch.backends.cuda.preferred_blas_library("cublas")
            cells = [f"{t:.1f} ({nbytes / t / 1e3:.0f})" for t in (a, b, c)]
            print(f"| {name} {n}x{k} | {m} | " + " | ".join(cells) + " |")
        del w_nk, w_kn
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
