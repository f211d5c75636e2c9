"""INT4 Linears at decode and prefill row counts through Int4Linear's own forward (so the same
script times any version of the package on PYTHONPATH), RANDOM WEIGHTS, against bf16 F.linear:
GPU time per call (a CUDA graph of 20 calls, median of 30).

Usage (GPU machine): python3 scripts/gpu/int4_rows.py [8b[,1b]] [1,4,16,64,600]
"""

import sys

import torch

from voicert.bench.fp8 import SHAPE_SETS, _linear, time_graph
from voicert.engine.gpu.int4 import Int4Linear


def main(shapes: str = "8b", rows: str = "1,4,16,64,600") -> None:
    counts = [int(r) for r in rows.split(",")]
    for shape in shapes.split(","):
        total = {m: [0.0, 0.0] for m in counts}
        for name, n, k in SHAPE_SETS[f"llama-{shape}"]:
            w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
            q = Int4Linear.from_linear(_linear(w))
            cells = []
            for m in counts:
                x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                ref = time_graph(lambda x=x: torch.nn.functional.linear(x, w))
                t = time_graph(lambda x=x: q(x, pdl=True))
                total[m][0] += ref
                total[m][1] += t
                cells.append(f"{m}: {t:.1f} us ({ref / t:.2f}x bf16)")
            print(f"{shape} {name} {n}x{k}: " + " | ".join(cells), flush=True)
        print(
            f"{shape} the four: "
            + " | ".join(f"{m}: {t:.1f} us (bf16 {r:.1f})" for m, (r, t) in total.items()),
            flush=True,
        )


if __name__ == "__main__":
    main(*sys.argv[1:])
