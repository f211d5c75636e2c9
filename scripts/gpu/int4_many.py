"""INT4 Linears at 16 rows up to prefill sizes, RANDOM WEIGHTS, on the GPU machine: bf16
F.linear; the weights widened into a scratch then cuBLAS (the path before section 58); the
decode kernel (each group's sum scaled, path GROUPS) up to 64 rows; and the kernel that
widens each weight whole with its scale (path SCALED) over a set of tiles (the weights as
the MMA's first operand, or its second: "noswap"), its best tile and the default's. GPU time
per call in a CUDA graph of 20 calls, median of 30; "err" is the largest
difference from F.linear on the widened bf16 weights, relative to the largest output.

Usage (GPU machine, repo root): python3 scripts/gpu/int4_many.py [8b[,1b]] [16,64,128,600,2048]
"""

import sys

import torch
from triton.runtime.errors import OutOfResources

from voicert.bench.fp8 import SHAPE_SETS, _linear, time_graph
from voicert.engine.gpu import kernels
from voicert.engine.gpu.int4 import Int4Linear

TILES = [  # (BM, BN, warps, stages); the split is chosen as by default
    (16, 64, 4, 4),
    (32, 64, 4, 3),
    (64, 64, 4, 3),
    (64, 128, 4, 3),
    (64, 128, 8, 3),
    (128, 64, 4, 3),
    (128, 128, 8, 3),
    (128, 128, 8, 4),
    (128, 256, 8, 2),
    (256, 128, 8, 2),
    (256, 64, 8, 3),
]


def _err(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.float() - want).abs().max() / want.abs().max()).item()


def main(shapes: str = "8b", rows: str = "16,64,128,600,2048") -> None:
    counts = [int(r) for r in rows.split(",")]
    for shape in shapes.split(","):
        total: dict[int, list[float]] = {m: [0.0] * 5 for m in counts}
        for name, n, k in SHAPE_SETS[f"llama-{shape}"]:
            w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
            q = Int4Linear.from_linear(_linear(w))
            wq = q.dequantized(torch.bfloat16)
            for m in counts:
                x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                want = torch.nn.functional.linear(x.float(), wq.float())
                ref = time_graph(lambda x=x: torch.nn.functional.linear(x, w))
                wide = time_graph(
                    lambda x=x: torch.nn.functional.linear(
                        x, kernels.int4_dequantize(q.weight, q.scale, q.low, x.dtype)
                    )
                )
                old = float("nan")
                if m <= 64:
                    old = time_graph(
                        lambda x=x: kernels.int4_linear(
                            x, q.weight, q.scale, q.low, None, path=kernels.Int4Path.GROUPS
                        )
                    )
                best = None
                for tile, swap in [(t, sw) for t in TILES for sw in (True, False)]:
                    if tile[0] > 2 * max(m, 16) or (not swap and tile[0] < 64):
                        continue

                    def run(x=x, tile=tile, swap=swap):
                        return kernels.int4_linear(
                            x,
                            q.weight,
                            q.scale,
                            q.low,
                            None,
                            None,
                            tile,
                            swap=swap,
                            path=kernels.Int4Path.SCALED,
                        )

                    try:
                        t = time_graph(run)
                    except OutOfResources:  # (shared memory: this tile's stages do not fit)
                        continue
                    tag = "x".join(map(str, tile)) + ("" if swap else " noswap")
                    best = (t, tag) if best is None else min(best, (t, tag))
                t, tag = best
                dflt = time_graph(
                    lambda x=x: kernels.int4_linear(
                        x, q.weight, q.scale, q.low, None, path=kernels.Int4Path.SCALED
                    )
                )
                err = _err(
                    kernels.int4_linear(
                        x, q.weight, q.scale, q.low, None, path=kernels.Int4Path.SCALED
                    ),
                    want,
                )
                for i, v in enumerate((ref, wide, old, t, dflt)):
                    total[m][i] += v
                print(
                    f"{shape} {name} {n}x{k} rows {m}: bf16 {ref:.1f} | widen+cuBLAS {wide:.1f} "
                    f"| decode kernel {old:.1f} | scaled best {tag} "
                    f"{t:.1f} ({ref / t:.2f}x bf16) | scaled default {dflt:.1f} (err {err:.1e})",
                    flush=True,
                )
        for m, (ref, wide, old, t, dflt) in total.items():
            print(
                f"{shape} the four, rows {m}: bf16 {ref:.1f} | widen+cuBLAS {wide:.1f} | decode "
                f"kernel {old:.1f} | scaled best {t:.1f} | scaled default {dflt:.1f}",
                flush=True,
            )


if __name__ == "__main__":
    main(*sys.argv[1:])
