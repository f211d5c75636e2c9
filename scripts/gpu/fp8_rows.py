"""FP8 Linears at a few rows (decode steps of 2 to 64 streams), RANDOM WEIGHTS, on the GPU
machine: bf16 F.linear (cuBLAS), kernels.fp8_linear as served (the weights widened in registers
up to FP8_MMA_ROWS, cuBLAS's _scaled_mm above), and kernels.fp8_mm (the rows rounded to FP8,
then the FP8 tensor cores with the weights first; both launches timed) over a few tiles. Every
call reads weights no call before it read in the last ~512 MB, as a step does
(scripts/gpu/gemv_fp8.py's rotation). GPU time per call in a CUDA graph (median of 30 replays),
the FP8 bytes read per second, and each form's error against F.linear on the widened weights
and the unrounded rows (relative norm).

Usage (GPU machine, repo root, PYTHONPATH as scripts/gpu/kernel-env.sh sets it):
python3 scripts/gpu/fp8_rows.py [8b,1b] [2,8,16,32,64] [splits]
("splits": fp8_mm's 64- and 128-wide tiles at each SPLIT of SPLITS instead of MM_TILES)
"""

import itertools
import sys

import torch

from voicert.bench.fp8 import SHAPE_SETS, _linear, time_graph
from voicert.engine.gpu import kernels
from voicert.engine.gpu.fp8 import Fp8Linear

ROTATE_BYTES = 512 << 20
# fp8_mm's (BLOCK_N, BLOCK_K, num_warps, num_stages[, SPLIT]); no SPLIT: by the default rule
MM_TILES = [(128, 128, 4, 4), (64, 128, 4, 4), (128, 256, 4, 3), (64, 256, 4, 4), (128, 128, 8, 4)]
MM_TILES += [(128, 128, 4, 4, 1), (64, 128, 4, 6)]
SPLITS = (1, 2, 3, 4, 6, 8)


def _rotating(fns: list):
    it = itertools.cycle(fns)
    return lambda: next(it)()


def _shape(n: int, k: int, rows: list[int], tiles: list[tuple]) -> list[str]:
    one = Fp8Linear.from_linear(_linear(torch.randn(n, k, device="cuda") * 0.02))
    nbytes = one.weight.nbytes + one.scale.nbytes
    copies = max(4, -(-ROTATE_BYTES // nbytes))
    qs = [one] + [
        Fp8Linear.from_linear(_linear(torch.randn(n, k, device="cuda") * 0.02))
        for _ in range(copies - 1)
    ]
    count = kernels.counters("cuda", 1 << 15)
    ws = [
        torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(max(4, copies // 4))
    ]
    lines = []
    for m in rows:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        want = torch.nn.functional.linear(x.float(), one.dequantized(torch.float32))

        def cell(label: str, blocks, mm, x=x, want=want) -> str:
            def call(q):
                if mm:
                    return kernels.fp8_mm(x, q.weight, q.scale, None, count, blocks)
                return kernels.fp8_linear(x, q.weight, q.scale, None, count, blocks)

            err = ((call(one).float() - want).norm() / want.norm()).item()
            us = time_graph(_rotating([lambda q=q: call(q) for q in qs]), copies)
            return f"{label} {us:.1f} ({nbytes / us / 1e3:.0f} GB/s, err {err:.1e})"

        bf16 = time_graph(
            _rotating([lambda w=w: torch.nn.functional.linear(x, w) for w in ws]), len(ws)
        )
        cells = [f"bf16 {bf16:.1f}", cell("served", None, False)]
        for tile in tiles:
            blocks = (min(64, max(16, kernels.common._pow2(m))), *tile)
            cells.append(cell("mm " + "x".join(map(str, tile)), blocks, True))
        lines.append(f"{m} rows | " + " | ".join(cells))
    return lines


def main(shapes: str = "8b,1b", rows: str = "2,8,16,32,64", mode: str = "tiles") -> None:
    tiles = MM_TILES
    if mode == "splits":
        tiles = [(bn, 128, 4, 4, split) for bn in (64, 128) for split in SPLITS]
    print(f"# {torch.cuda.get_device_name()}; us per call (FP8 GB/s), RANDOM WEIGHTS", flush=True)
    for shape in shapes.split(","):
        for name, n, k in SHAPE_SETS[f"llama-{shape}"]:
            for line in _shape(n, k, [int(r) for r in rows.split(",")], tiles):
                print(f"{shape} {name} {n}x{k} {line}", flush=True)
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main(*sys.argv[1:])
