"""bf16 Linears at few rows: cuBLAS (F.linear) against kernels.fp8_linear's kernel run unscaled on
bf16 weights, per tile setting. GPU microseconds per call inside a CUDA graph of 20 calls (P50 of
30 replays) and the weight bytes read per second.

    python3 scripts/gpu/gemv_bf16.py [ROWS,...]
"""

import sys

import torch

from voicert.bench.cuda_time import graph_times
from voicert.engine import kernels

SHAPES = {"1b qkv": (3072, 2048), "1b o": (2048, 2048), "1b gate_up": (16384, 2048),
          "1b down": (2048, 8192), "8b qkv": (6144, 4096), "8b o": (4096, 4096),
          "8b gate_up": (28672, 4096), "8b down": (4096, 14336)}
BLOCKS = [(16, 32, 256, 4, 4), (16, 32, 128, 4, 4), (16, 64, 128, 4, 4), (16, 64, 64, 4, 4),
          (16, 16, 256, 4, 4), (16, 32, 256, 4, 3), (16, 32, 128, 8, 4), (16, 64, 128, 8, 3)]


def p50(fn) -> float:
    t = sorted(graph_times(fn, 20, 30))
    return t[len(t) // 2]


def main() -> None:
    rows = [int(r) for r in (sys.argv[1] if len(sys.argv) > 1 else "1,8").split(",")]
    count = kernels.counters("cuda")
    print("| shape | rows | cuBLAS us (GB/s) | " + " | ".join(
        "x".join(map(str, b[:3])) + f" w{b[3]} s{b[4]}" for b in BLOCKS) + " |")
    print("|---|---:|---:|" + "---:|" * len(BLOCKS))
    for name, (n, k) in SHAPES.items():
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
        gb = n * k * 2 / 1e9
        for m in rows:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            want = torch.nn.functional.linear(x, w).float()
            base = p50(lambda: torch.nn.functional.linear(x, w))
            cells = []
            for b in BLOCKS:
                got = kernels.fp8_linear(x, w, None, None, count, blocks=b).float()
                err = ((got - want).norm() / want.norm()).item()
                assert err < 1e-2, (name, m, b, err)
                t = p50(lambda: kernels.fp8_linear(x, w, None, None, count, blocks=b))
                cells.append(f"{t:.1f} ({gb / t * 1e6:.0f})")
            print(f"| {name} | {m} | {base:.1f} ({gb / base * 1e6:.0f}) | " + " | ".join(cells)
                  + " |")


if __name__ == "__main__":
    main()
