"""A one-row INT4 kernel over K-major words, for the layout decision of docs/benchmarks.md 50:
the codes packed eight to a 32-bit word along K, words laid out [K / 8, N], scales and zeros
[G, N], so a warp reads consecutive output columns' words (as gemlite's one-row kernel reads
them) and each thread multiplies its eight codes on the CUDA cores. RANDOM WEIGHTS, the very
same codes as Int4Linear's, against our MMA kernel and bf16 F.linear (and gemlite with its
output in fp32, when installed).

Usage:
    TRITON_INTERPRET=1 python scripts/gpu/int4_kmajor.py check      # the kernel == torch, on the CPU
    python3 scripts/gpu/int4_kmajor.py time [8b[,1b]]                # GPU machine
"""

from __future__ import annotations

import sys

import torch
import triton
import triton.language as tl

from voicert.engine.gpu import kernels
from voicert.engine.gpu.awq import awq_zeros
from voicert.engine.gpu.int4 import Int4Linear, unpack


def kmajor(q: Int4Linear) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q's codes as words [K / 8, N] int32 (word i of column n: codes 8i .. 8i + 7, code 8i + j
    in bits 4j .. 4j + 3), its scales and zeros as [G, N] (q on AWQ's grid, ``integer_zero``)."""
    codes = unpack(q.weight, q.group).to(torch.int32)  # [N, K]
    n, k = codes.shape
    c = codes.t().reshape(k // 8, 8, n)  # [K / 8, 8, N]
    words = torch.zeros(k // 8, n, dtype=torch.int64, device=codes.device)
    for j in range(8):
        words |= c[:, j].to(torch.int64) << (4 * j)
    words = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)
    return words, q.scale.t().contiguous(), awq_zeros(q).t().contiguous()


@triton.jit
def _codes_f32(w, j: tl.constexpr):
    """Code j of each word, exactly as float32 (2^23 + code, less 2^23)."""
    c = (w >> (4 * j)) & 15
    return (c | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0


@triton.jit
def _kmajor_gemv_kernel(
    x_ptr,
    w_ptr,
    s_ptr,
    z_ptr,
    out_ptr,
    part_ptr,
    count_ptr,
    N,
    K,
    k_per_split,
    SPLIT: tl.constexpr,
    BLOCK_N: tl.constexpr,
    GROUP: tl.constexpr,
    STEP: tl.constexpr,
):
    pid_n = tl.program_id(0)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    nm = rn < N
    GW: tl.constexpr = GROUP // 8  # words per group along K
    rw = tl.arange(0, GW)
    k_lo = tl.program_id(2) * k_per_split  # a multiple of GROUP * STEP
    k_hi = tl.minimum(k_lo + k_per_split, K)
    acc = tl.zeros((GW, BLOCK_N), dtype=tl.float32)
    zx = tl.zeros((BLOCK_N,), dtype=tl.float32)
    KSTEP: tl.constexpr = GROUP * STEP
    for k0 in range(k_lo, k_hi, KSTEP):
        for i in tl.static_range(STEP):
            kg = k0 + i * GROUP
            live = kg < k_hi
            g = kg // GROUP
            w = tl.load(
                w_ptr + (kg // 8 + rw)[:, None].to(tl.int64) * N + rn[None, :],
                mask=nm[None, :] & live,
                other=0,
            )  # [GW, BN] int32
            part = tl.zeros((GW, BLOCK_N), dtype=tl.float32)
            xs = tl.zeros((GW,), dtype=tl.float32)
            for j in tl.static_range(8):
                xj = tl.load(x_ptr + kg + 8 * rw + j, mask=live, other=0.0).to(tl.float32)  # [GW]
                part += _codes_f32(w, j) * xj[:, None]
                xs += xj
            sc = tl.load(s_ptr + g * N + rn, mask=nm & live, other=0.0).to(tl.float32)  # [BN]
            zr = tl.load(z_ptr + g * N + rn, mask=nm & live, other=0).to(tl.float32)
            acc += part * sc[None, :]
            zx += sc * zr * tl.sum(xs, axis=0)
    total = (tl.sum(acc, axis=0) - zx)[None, :]  # [1, BN]
    rm = tl.arange(0, 1)
    kernels.common._split_k_finish(
        total, rm, rn, rm < 1, nm, 1, N, s_ptr, s_ptr, out_ptr, part_ptr, count_ptr,
        SPLIT, False, False,
    )  # fmt: skip


def kmajor_gemv(
    x: torch.Tensor,
    words: torch.Tensor,
    scale: torch.Tensor,
    zero: torch.Tensor,
    blocks: tuple[int, int, int, int, int],
    count: torch.Tensor | None = None,
) -> torch.Tensor:
    """x [K] times the K-major weights -> [N] in x's dtype. blocks: (BLOCK_N, warps, stages,
    programs aimed at, STEP)."""
    k, n = 8 * words.shape[0], words.shape[1]
    group = k // scale.shape[0]
    bn, warps, stages, programs, step = blocks
    tiles = triton.cdiv(n, bn)
    split = max(1, min(32, triton.cdiv(programs, tiles), k // (group * step)))
    k_per_split = triton.cdiv(triton.cdiv(k, split), group * step) * group * step
    split = triton.cdiv(k, k_per_split)
    out = torch.empty(1, n, dtype=x.dtype, device=x.device)
    part = torch.empty(split, 1, n, dtype=torch.float32, device=x.device) if split > 1 else out
    count = kernels.counters(x.device, tiles) if count is None else count
    _kmajor_gemv_kernel[(tiles, 1, split)](
        x,
        words,
        scale,
        zero,
        out,
        part,
        count,
        n,
        k,
        k_per_split,
        SPLIT=split,
        BLOCK_N=bn,
        GROUP=group,
        STEP=step,
        num_warps=warps,
        num_stages=stages,
    )
    return out.view(n)


TILES = [  # (BLOCK_N, warps, stages, programs aimed at, STEP)
    (128, 4, 3, 528, 1),
    (256, 4, 3, 528, 1),
    (256, 4, 2, 264, 2),
    (256, 4, 4, 528, 1),
    (256, 4, 3, 1056, 1),
    (256, 2, 3, 528, 1),
    (512, 4, 3, 528, 1),
    (512, 8, 3, 528, 1),
    (128, 4, 2, 264, 2),
    (256, 4, 3, 264, 1),
]


def check() -> None:
    """The kernel against F.linear on the widened weights (fp32), several tiles and splits."""
    import tests.engine.test_kernels  # noqa: F401 - its interpreter fix (Triton 3.6, NumPy 2.4)

    g = torch.Generator().manual_seed(3)
    for n, k, group in ((96, 256, 128), (200, 512, 64), (64, 384, 128)):
        q = Int4Linear.from_linear(torch.nn.Linear(k, n, bias=False), None, group, True)
        words, scale, zero = kmajor(q)
        x = torch.randn(k, generator=g)
        want = torch.nn.functional.linear(x, q.dequantized(torch.float32))
        for blocks in ((32, 4, 2, 1, 1), (64, 4, 2, 8, 1), (32, 4, 2, 4, 2)):
            got = kmajor_gemv(x, words, scale, zero, blocks)
            err = float((got - want).abs().max())
            assert err < 1e-4 * float(want.abs().max()), (n, k, group, blocks, err)
    print("check: the K-major kernel == F.linear on the widened weights")


def time_shapes(shapes: str = "8b") -> None:
    from voicert.bench.fp8 import SHAPE_SETS, _linear, time_graph

    try:
        import gemlite  # noqa: F401
        from int4_gemlite import gemlite_layer
    except ImportError:
        gemlite_layer = None
    print(torch.cuda.get_device_name(), flush=True)
    for shape in shapes.split(","):
        total = {}
        for name, n, k in SHAPE_SETS[f"llama-{shape}"]:
            w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
            q = Int4Linear.from_linear(_linear(w), integer_zero=True)
            words, scale, zero = kmajor(q)
            x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
            want = torch.nn.functional.linear(x.float(), q.dequantized(torch.float32))[0]
            count = kernels.counters("cuda")
            cells = {
                "bf16": time_graph(lambda x=x, w=w: torch.nn.functional.linear(x, w)),
                "ours MMA": time_graph(
                    lambda x=x, q=q: kernels.int4_linear(x, q.weight, q.scale, q.zero, None)
                ),
            }
            if gemlite_layer is not None:
                gl32 = gemlite_layer(q, "FP32")
                cells["gemlite fp32"] = time_graph(lambda x=x, gl32=gl32: gl32(x).to(x.dtype))
            best = None
            for b in TILES:
                got = kmajor_gemv(x[0], words, scale, zero, b, count)
                err = float((got.float() - want).abs().max() / want.abs().max())
                t = time_graph(
                    lambda b=b, x=x, words=words, scale=scale, zero=zero, count=count: kmajor_gemv(
                        x[0], words, scale, zero, b, count
                    )
                )
                print(f"  {name} K-major {b}: {t:.1f} us, err {err:.1e}", flush=True)
                best = (t, b) if best is None or t < best[0] else best
            cells["K-major best"] = best[0]
            nbytes = words.nbytes + scale.nbytes + zero.nbytes
            for key, t in cells.items():
                total[key] = total.get(key, 0.0) + t
            print(
                f"{shape} {name} {n}x{k} one row: "
                + " | ".join(
                    f"{key} {t:.1f} us ({nbytes / t / 1e3:.0f} GB/s)" for key, t in cells.items()
                )
                + f" | best tile {best[1]}",
                flush=True,
            )
        print(f"{shape} the four: " + " | ".join(f"{k} {t:.1f} us" for k, t in total.items()))


if __name__ == "__main__":
    if sys.argv[1:2] == ["check"]:
        check()
    else:
        time_shapes(*sys.argv[2:3])
