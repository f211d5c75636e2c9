"""One-row INT4 Linears as a decode step reads them, RANDOM WEIGHTS, on the GPU machine: bf16
F.linear, the MMA kernel's GROUPS path (the default before ``kernels.int4_gemv``) and
``kernels.int4_gemv`` (the CUDA cores, the codes read as words; its x layout launched first, as
served) over a set of tiles (and K split), kernels.int4_gemv_a8 (x rounded to int8 by group,
dp4a; its x launched first too) over a few, int4_gemv's K loop unrolled twice or not, then 2
rows by GROUPS and by int4_gemv's rows form, each in groups of 128 and of 32. Every call reads weights no call
before it read in the last ~512 MB, as a step does (scripts/gpu/gemv_fp8.py's rotation). GPU
time per call in a CUDA graph (median of 30 replays), the bytes read per second, and each
kernel's error against F.linear on the widened weights (relative norm).

Usage (GPU machine, repo root): python3 scripts/gpu/int4_gemv.py [8b,1b] [128,32]
"""

import itertools
import sys

import torch

from voicert.bench.fp8 import SHAPE_SETS, _linear, time_graph
from voicert.engine.gpu import kernels
from voicert.engine.gpu.int4 import Int4Linear

ROTATE_BYTES = 512 << 20
P = kernels.Int4Path
# (BLOCK_N, words a row a K step, warps[, SPLIT]) for int4_gemv (no SPLIT: its default rule);
# (4, 128, 1), (2, 256, 1) and wider take 128-255 registers on sm_90 (64 here)
GEMV_TILES = [(2, 128, 1), (1, 128, 1), (2, 64, 1), (2, 128, 1, 2), (1, 128, 1, 2)]
GEMV_TILES += [(2, 128, 1, 4)]


def _rotating(fns: list):
    it = itertools.cycle(fns)
    return lambda: next(it)()


def _shape(name: str, n: int, k: int, group: int) -> list[str]:
    one = Int4Linear.from_linear(_linear(torch.randn(n, k, device="cuda") * 0.02), None, group)
    nbytes = one.weight.nbytes + one.scale.nbytes + one.low.nbytes
    copies = max(4, -(-ROTATE_BYTES // nbytes))
    qs = [one] + [
        Int4Linear.from_linear(_linear(torch.randn(n, k, device="cuda") * 0.02), None, group)
        for _ in range(copies - 1)
    ]
    x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
    want = torch.nn.functional.linear(x.float(), one.dequantized(torch.float32))
    count = kernels.counters("cuda", 1 << 15)  # (split tiles of gate_up: 14,336)

    def cell(label: str, path, blocks, x=x, want=want, a8=False) -> str:
        def call(q):
            if a8:  # W4A8: x rounded to int8 by group, dp4a (its error includes that rounding)
                return kernels.int4_gemv_a8(x, q.weight, q.scale, q.low, None, count, blocks)
            return kernels.int4_linear(x, q.weight, q.scale, q.low, None, count, blocks, path=path)

        err = ((call(one).float() - want).norm() / want.norm()).item()
        us = time_graph(_rotating([lambda q=q: call(q) for q in qs]), copies)
        return f"{label} {us:.1f} us {nbytes / us / 1e3:.0f} GB/s (err {err:.1e})"

    ws = [
        torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(max(4, copies // 4))
    ]
    bf16 = time_graph(
        _rotating([lambda w=w: torch.nn.functional.linear(x, w) for w in ws]), len(ws)
    )
    cells = [f"bf16 {bf16:.1f}", cell("groups", P.GROUPS, None)]
    cells += [cell("gemv" + "x".join(map(str, t)), P.GEMV, t) for t in GEMV_TILES]
    cells += [cell("a8" + "x".join(map(str, t)), None, t, a8=True) for t in GEMV_TILES[:3]]
    cells.append(cell("a8", None, None, a8=True))
    unroll = kernels.int4_matmul.INT4_GEMV_UNROLL_TILES  # the K loop always / never unrolled twice
    for label, tiles in (("unrolled", 1 << 30), ("not unrolled", 0)):
        kernels.int4_matmul.INT4_GEMV_UNROLL_TILES = tiles
        cells.append(cell(label, P.GEMV, None))
    kernels.int4_matmul.INT4_GEMV_UNROLL_TILES = unroll
    # two rows: the MMA kernel against the codes widened once for both
    xm = torch.randn(2, k, device="cuda", dtype=torch.bfloat16)
    wm = torch.nn.functional.linear(xm.float(), one.dequantized(torch.float32))
    cells.append(cell("2 rows: groups", P.GROUPS, None, xm, wm))
    cells.append(cell("2 rows: gemv", P.GEMV, None, xm, wm))
    return cells


def main(shapes: str = "8b,1b", groups: str = "128,32") -> None:
    for shape, group in itertools.product(shapes.split(","), map(int, groups.split(","))):
        for name, n, k in SHAPE_SETS[f"llama-{shape}"]:
            cells = _shape(name, n, k, group)
            print(f"{shape} g{group} {name} {n}x{k} | " + " | ".join(cells), flush=True)
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main(*sys.argv[1:])
