"""Where a batch-1 decode attention's ~9-12 us go (docs/benchmarks.md 72: 8.9 us a layer of the
1B step, for 1.2 MB of keys and values). Times, in CUDA graphs, one layer's paged attention at
one row over ``CONTEXT`` keys, the block table padded to the engine's span bucket as a decode
graph has it, with the key splits and keys a step forced (the module's settings patched), one
split (no merge), and beside them an empty launch of as many programs and the other small
kernels of the step (the floor a launch pays). Each attention output is checked against the
default's. Usage (repo root, a GPU): python scripts/gpu/attn_latency.py [CONTEXT [SPAN]]

For Nsight Compute (where the served launch stalls), ``ncu SHAPE`` makes only three plain
launches of it (1b or 8b, 600 keys, span 1024), the first compiling:

  ncu --kernel-name regex:_paged_attn_kernel --launch-skip 2 --launch-count 1 --set full \
      python3 scripts/gpu/attn_latency.py ncu 8b > ncu-attn.txt"""

import sys

import numpy as np
import torch
import triton
import triton.language as tl

from voicert.bench.attention import Case, make_pool
from voicert.bench.cuda_time import graph_times
from voicert.engine.gpu import kernels

att = kernels.attention
SHAPES = {"1b": (32, 8, 64), "8b": (32, 8, 128)}


@triton.jit
def _empty(x_ptr, out_ptr):
    """One load and one store a program: what any launch of that many programs costs."""
    i = tl.program_id(0)
    tl.store(out_ptr + i, tl.load(x_ptr + i) + 1.0)


def p50(fn, calls=20, replays=30) -> float:
    return float(np.percentile(graph_times(fn, calls, replays), 50))


def paged(pool, heads, count, block_n=0, target=None, most=None, stages=0):
    h, kvh, _d = heads
    names = (
        "_DECODE_BLOCK_N",
        "_DECODE_STAGES",
        "_SPLIT_TARGET",
        "_MAX_SPLITS",
    )

    def call():
        saved = [getattr(att, n) for n in names]
        chosen = (block_n, stages, target or saved[2], most or saved[3])
        for n, v in zip(names, chosen):
            setattr(att, n, v)
        try:
            return kernels.paged_attention(
                pool.qkv, pool.k, pool.v, pool.tables, pool.positions, h, kvh, count
            )
        finally:
            for n, v in zip(names, saved):
                setattr(att, n, v)

    return call


def for_ncu(name: str) -> None:
    """Three launches of the served attention at one row over 600 keys (span 1024)."""
    heads = SHAPES[name]
    pool = make_pool(Case(1, 1, 600), heads, 16, torch.bfloat16, "cuda")
    pool.tables = torch.nn.functional.pad(pool.tables, (0, 1024 // 16 - pool.tables.shape[1]))
    call = paged(pool, heads, kernels.counters("cuda"))
    for _ in range(3):
        call()
    torch.cuda.synchronize()


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "ncu":
        for_ncu(sys.argv[2] if len(sys.argv) > 2 else "8b")
        return
    context = int(sys.argv[1]) if len(sys.argv) > 1 else 600
    span = int(sys.argv[2]) if len(sys.argv) > 2 else 1024
    print(f"{torch.cuda.get_device_name()}, context {context}, block table span {span}")
    for name, heads in SHAPES.items():
        h, _kvh, d = heads
        pool = make_pool(Case(1, 1, context), heads, 16, torch.bfloat16, "cuda")
        pad = span // 16 - pool.tables.shape[1]
        pool.tables = torch.nn.functional.pad(pool.tables, (0, pad))  # scratch block 0
        count = kernels.counters("cuda")
        want = paged(pool, heads, count)()
        rows = []
        x = torch.zeros(1024, device="cuda")
        y = torch.empty_like(x)
        for programs in (8, 128):
            rows.append(
                (f"empty launch, {programs} programs", p50(lambda: _empty[(programs,)](x, y)), 0.0)
            )
        hid = torch.randn(1, h * d, device="cuda", dtype=torch.bfloat16)
        res, w = torch.randn_like(hid), torch.ones(h * d, device="cuda", dtype=torch.bfloat16)
        rows.append(
            ("add_rms_norm, one row", p50(lambda: kernels.add_rms_norm(hid, res, w, 1e-5)), 0.0)
        )
        for label, kw in [
            ("default", {}),
            ("1 split (no merge)", {"target": 8}),
            ("2 splits", {"target": 16}),
            ("4 splits", {"target": 32}),
            ("8 splits", {"target": 64}),
            ("32 keys a step", {"block_n": 32}),
            ("32 keys, up to 32 splits", {"block_n": 32, "target": 256, "most": 32}),
            ("16 keys, up to 64 splits", {"block_n": 16, "target": 512, "most": 64}),
            ("2 stages", {"stages": 2}),
            ("1 stage", {"stages": 1}),
        ]:
            fn = paged(pool, heads, count, **kw)
            try:
                err = (fn().float() - want.float()).abs().max().item()
                rows.append((label, p50(fn), err))
            except Exception as exc:  # a setting that does not compile is a finding too
                rows.append((f"{label}: {type(exc).__name__}", float("nan"), float("nan")))
        print(f"\n### llama-{name} heads {heads}, bf16, one row\n")
        print("| launch | us a call (P50, CUDA graph) | max diff from default |")
        print("|---|---:|---:|")
        for label, us, err in rows:
            print(f"| {label} | {us:.2f} | {err:.1e} |")


if __name__ == "__main__":
    main()
