"""INT4 kernel variants on the GPU machine, RANDOM WEIGHTS: each Llama-8B / 1B Linear shape at
decode row counts, the kernel's tiles with codes widened by their bits (magic) or through int32,
against bf16 F.linear (more rows: scripts/gpu/int4_many.py) (GPU time per call in a CUDA
graph of 20 calls, median of 30; the GB/s of the weight bytes each read).

Usage (GPU machine, repo root): python3 scripts/gpu/int4_tiles.py [8b,1b] [1,4,16]
"""

import sys

import torch

from voicert.bench.fp8 import SHAPE_SETS, _linear, time_graph
from voicert.engine.gpu import kernels
from voicert.engine.gpu.int4 import Int4Linear

VARIANTS = [(False, False), (False, True), (True, True)]  # (magic, swap)
TILES = [  # (BM, BN, warps, stages[, split])
    (16, 32, 4, 3),
    (16, 64, 4, 2),
    (16, 64, 4, 4),
    (16, 128, 4, 3),
    (16, 128, 8, 3),
    (16, 256, 8, 3),
    (16, 64, 4, 3, 1),
    (16, 128, 4, 3, 2),
]


def main(shapes: str = "8b,1b", rows: str = "1,4,16") -> None:
    for shape in shapes.split(","):
        for name, n, k in SHAPE_SETS[f"llama-{shape}"]:
            w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
            q = Int4Linear.from_linear(_linear(w))
            nbytes = q.weight.nbytes + q.scale.nbytes + q.low.nbytes
            for m in [int(r) for r in rows.split(",")]:
                x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                ref = time_graph(lambda: torch.nn.functional.linear(x, w))
                cells = [f"bf16 {ref:.1f}"]
                for magic, swap in VARIANTS:
                    best = None
                    for tile in TILES:
                        count = kernels.counters("cuda")

                        def run(tile=tile, count=count, magic=magic, swap=swap):
                            return kernels.int4_linear(
                                x,
                                q.weight,
                                q.scale,
                                q.low,
                                None,
                                count,
                                tile,
                                magic=magic,
                                swap=swap,
                            )

                        t = time_graph(run)
                        best = (t, tile) if best is None else min(best, (t, tile))
                    t, tile = best
                    cells.append(
                        f"{'magic' if magic else 'int32'}{' swap' if swap else ''} "
                        f"{'x'.join(map(str, tile))} {t:.1f} "
                        f"({nbytes / t / 1e3:.0f} GB/s, {ref / t:.2f}x)"
                    )
                print(f"{shape} {name} {n}x{k} rows {m}: " + " | ".join(cells), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
