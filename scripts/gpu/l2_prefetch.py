"""Does warming L2 with the next Linear's weight pay on this GPU? (Branch ``l2-prefetch`` had the
norms, SiLU * up and attention do it in the engine: 1B bf16 0.90 -> 2.01 ms a step with 8 MiB;
docs/benchmarks.md 72.) Times, in CUDA graphs, (1) a launch that only asks L2 for N MiB by
bulk prefetch (``cp.async.bulk.prefetch.L2``, sm_90) from P programs, and (2) a one-row gemv
over a weight just flushed from L2, after a 10 us spin, with and without its first N MiB
warmed before the spin: by bulk prefetch, the same with an evict_last policy, or by loads.
Usage (repo root, a Hopper GPU): python scripts/gpu/l2_prefetch.py"""

import torch
import triton
import triton.language as tl

from voicert.bench.fp8 import time_graph
from voicert.engine.gpu import kernels


@triton.jit
def _prefetch(w_ptr, nbytes, LANES: tl.constexpr, LAST: tl.constexpr):
    """Program p of P asks L2 for its share of the ``nbytes`` bytes at ``w_ptr`` (16-byte
    aligned, a multiple of 16): one bulk prefetch per lane of ``LANES``; ``LAST``: with an
    evict_last policy."""
    lane = (tl.program_id(0) * LANES + tl.arange(0, LANES)).to(tl.int64)
    per = tl.cdiv(tl.cdiv(nbytes, tl.num_programs(0) * LANES), 16) * 16  # bytes a lane
    start = lane * per
    size = tl.minimum(per, tl.maximum(nbytes - start, 0)).to(tl.int32)
    addr = (w_ptr.to(tl.pointer_type(tl.int8)) + start).to(tl.int64, bitcast=True)
    if LAST:
        asm: tl.constexpr = (
            "{ .reg .pred p; .reg .b64 pol; setp.gt.s32 p, $2, 0; "
            "createpolicy.fractional.L2::evict_last.b64 pol, 1.0; "
            "@p cp.async.bulk.prefetch.L2.global.L2::cache_hint [$1], $2, pol; mov.b32 $0, 0; }"
        )
    else:
        asm: tl.constexpr = (
            "{ .reg .pred p; setp.gt.s32 p, $2, 0; "
            "@p cp.async.bulk.prefetch.L2.global [$1], $2; mov.b32 $0, 0; }"
        )
    tl.inline_asm_elementwise(asm, "=r,l,r", [addr, size], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _touch(w_ptr, out_ptr, n, BLOCK: tl.constexpr):
    """Warm L2 by loading the first n elements (a sum, so the loads stay)."""
    acc = tl.zeros([BLOCK], tl.float32)
    for i in range(tl.program_id(0) * BLOCK, n, tl.num_programs(0) * BLOCK):
        acc += tl.load(w_ptr + i + tl.arange(0, BLOCK), mask=i + tl.arange(0, BLOCK) < n).to(
            tl.float32
        )
    tl.store(out_ptr + tl.program_id(0), tl.sum(acc))


@triton.jit
def _spin(out_ptr, ns):
    t0 = tl.inline_asm_elementwise(
        "mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1
    )
    t = t0
    while t - t0 < ns:
        t = tl.inline_asm_elementwise(
            "mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1
        )
    tl.store(out_ptr, t - t0)


def main():
    dev = "cuda"
    w = torch.randn(16384, 2048, dtype=torch.bfloat16, device=dev)  # 64 MiB (1B gate_up)
    x = torch.randn(1, 2048, dtype=torch.bfloat16, device=dev)
    flush = torch.ones(64 << 20, dtype=torch.float32, device=dev)  # 256 MiB, read to flush
    sink = torch.empty(1024, dtype=torch.float32, device=dev)
    spun = torch.empty(1, dtype=torch.int64, device=dev)
    count = kernels.counters(dev)
    print("| prefetch only: MiB | programs | us a launch |\n|---:|---:|---:|")
    for mib in (1, 8, 24):
        for progs in (1, 8, 132, 528):
            us = time_graph(lambda: _prefetch[(progs,)](w, mib << 20, 128, False, num_warps=4))
            print(f"| {mib} | {progs} | {us:.1f} |")
    print(
        "\n| flush (256 MiB read), [warm], spin 10 us, gemv: how, MiB | programs | us | gemv's share |\n|---:|---:|---:|---:|"
    )
    gemv = lambda: kernels.gemv(x, w, None, None, count)
    spin = lambda: _spin[(1,)](spun, 10_000)

    def flush_l2():
        _touch[(528,)](flush, sink, flush.numel(), BLOCK=1024, num_warps=4)

    base_spin = time_graph(lambda: (flush_l2(), spin()), reps=5)
    cases = [("none", 0, 0), ("bulk", 16, 132), ("bulk", 32, 528), ("bulk evict_last", 16, 132)]
    cases += [("bulk evict_last", 32, 528), ("loads", 16, 528), ("loads", 32, 528)]
    for how, mib, progs in [*cases, ("loads", 64, 528)]:

        def step(how=how, mib=mib, progs=progs):
            flush_l2()
            if how == "loads":
                _touch[(progs,)](w, sink, (mib << 20) // 2, BLOCK=1024, num_warps=4)
            elif mib:
                _prefetch[(progs,)](w, mib << 20, 128, how == "bulk evict_last", num_warps=4)
            spin()
            gemv()

        us = time_graph(step, reps=5)
        print(f"| {how} {mib} | {progs} | {us:.1f} | {us - base_spin:.1f} |")
    print(f"(flush + spin alone: {base_spin:.1f} us)")


if __name__ == "__main__":
    main()
