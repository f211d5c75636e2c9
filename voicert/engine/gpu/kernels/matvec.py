"""One row times a weight matrix on the CUDA cores (:func:`gemv`): FP8 weights widened in
registers, or unscaled bf16 / fp16 ones. At one row a step only streams the weights, and
FMAs read them faster than the tensor cores' 16-row tiles do.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from voicert.engine.gpu.kernels.common import (
    FP8_PROGRAMS,
    _pdl_enter,
    _scale_bias,
    _split_k,
    _split_k_finish,
    _split_rule,
)


@triton.jit
def _gemv_kernel(
    x_ptr,
    w_ptr,
    s_ptr,
    b_ptr,
    out_ptr,
    part_ptr,
    count_ptr,
    N,
    K,
    k_per_split,
    HAS_SCALE: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    SPLIT: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PRE: tl.constexpr,
    X_WIDE: tl.constexpr,
    GLU: tl.constexpr,
    PDL: tl.constexpr,
):
    """:func:`_fp8_linear_kernel` for one row on the CUDA cores, no MMA: each weight tile
    [BN, BK] is widened to fp32 and multiplied by x's columns into a [BN, BK] accumulator by
    FMAs, summed over K once at the end (no reduction across threads in the loop). PRE (1, 2
    or 4): weight tiles loaded before the wait for the kernel before (PDL), so a program
    started during that kernel's tail streams its weights meanwhile. X_WIDE: one-byte weights
    read 8 bytes at a time, not 16, so that their tile takes x's layout (bf16 x in 16-byte
    vectors) and x is not moved through shared memory, with two barriers, every step. GLU
    (K not split): w is a gate_up [N, K], gate rows first; a program takes BN / 2 gate rows
    and their up rows, paired, and writes SiLU(gate) * up [N / 2] (:func:`_glu_finish`)."""
    pid_n, pid_k = tl.program_id(0), tl.program_id(2)
    if GLU:  # rows j: gate i, up i, gate i + 1, up i + 1, ... (i = the program's first output)
        j = tl.arange(0, BLOCK_N)
        rn = pid_n * (BLOCK_N // 2) + j // 2 + (j % 2) * (N // 2)
    else:
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    if GLU:  # (the plain form's statements in their old order: the same PTX)
        nm = pid_n * (BLOCK_N // 2) + tl.arange(0, BLOCK_N) // 2 < N // 2
    else:
        nm = rn < N
    k_lo = pid_k * k_per_split
    k_hi = tl.minimum(k_lo + k_per_split, K)
    x_ptrs = x_ptr + k_lo + rk  # [BK]
    if X_WIDE:  # FP8 weights read eight at a time, as x's bf16 vectors are: the same layout
        rkw = (rk // 8) * 8 + rk % 8
    else:
        rkw = rk
    w_ptrs = w_ptr + rn[:, None].to(tl.int64) * K + (k_lo + rkw)[None, :]  # [BN, BK]
    km = (k_lo + rk) < k_hi
    w = tl.load(w_ptrs, mask=nm[:, None] & km[None, :], other=0.0)  # before the wait (PDL)
    if PRE >= 2:
        w1 = tl.load(
            w_ptrs + BLOCK_K, mask=nm[:, None] & (k_lo + BLOCK_K + rk < k_hi)[None, :], other=0.0
        )
    if PRE >= 4:
        w2 = tl.load(
            w_ptrs + 2 * BLOCK_K,
            mask=nm[:, None] & (k_lo + 2 * BLOCK_K + rk < k_hi)[None, :],
            other=0.0,
        )
        w3 = tl.load(
            w_ptrs + 3 * BLOCK_K,
            mask=nm[:, None] & (k_lo + 3 * BLOCK_K + rk < k_hi)[None, :],
            other=0.0,
        )
    _pdl_enter(PDL)
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    if PRE >= 2:
        x = tl.load(x_ptrs, mask=km, other=0.0)
        acc += w.to(tl.float32) * x.to(tl.float32)[None, :]
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
        km = (k_lo + BLOCK_K + rk) < k_hi
        w = w1
    if PRE >= 4:
        x = tl.load(x_ptrs, mask=km, other=0.0)
        acc += w.to(tl.float32) * x.to(tl.float32)[None, :]
        x = tl.load(x_ptrs + BLOCK_K, mask=(k_lo + 2 * BLOCK_K + rk) < k_hi, other=0.0)
        acc += w2.to(tl.float32) * x.to(tl.float32)[None, :]
        x_ptrs += 2 * BLOCK_K
        w_ptrs += 2 * BLOCK_K
        km = (k_lo + 3 * BLOCK_K + rk) < k_hi
        w = w3
    x = tl.load(x_ptrs, mask=km, other=0.0)
    for k0 in range(k_lo + PRE * BLOCK_K, k_hi, BLOCK_K):
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
        km = (k0 + rk) < k_hi
        acc += w.to(tl.float32) * x.to(tl.float32)[None, :]
        w = tl.load(w_ptrs, mask=nm[:, None] & km[None, :], other=0.0)
        x = tl.load(x_ptrs, mask=km, other=0.0)
    acc += w.to(tl.float32) * x.to(tl.float32)[None, :]
    if GLU:  # paired rows: finished and rounded as the plain store rounds, then split
        y = _scale_bias(tl.sum(acc, axis=1), s_ptr, b_ptr, rn, nm, HAS_SCALE, HAS_BIAS)
        y = y.to(out_ptr.dtype.element_ty).to(tl.float32)
        g, u = tl.split(tl.reshape(y, (BLOCK_N // 2, 2)))  # [BN / 2] each: rows j even, odd
        _glu_finish(g, u, N // 2, out_ptr, BLOCK_N)
    else:
        rm = tl.arange(0, 1)
        _split_k_finish(
            tl.sum(acc, axis=1)[None, :], rm, rn, rm < 1, nm, 1, N, s_ptr, b_ptr, out_ptr,
            part_ptr, count_ptr, SPLIT, HAS_SCALE, HAS_BIAS,
        )  # fmt: skip


@triton.jit
def _glu_finish(g, u, inter, out_ptr, BLOCK_N: tl.constexpr):
    """A GLU program's finished outputs, paired: gate g and up u [BN / 2], to SiLU(g) * u at its
    outputs of out [inter]: bit for bit :func:`silu_mul`'s arithmetic on :func:`gemv`'s plain
    result (each rounded to out's dtype where they round)."""
    dtype = out_ptr.dtype.element_ty
    act = (g / (1.0 + tl.exp(-g))).to(dtype).to(tl.float32)
    i = tl.program_id(0) * (BLOCK_N // 2) + tl.arange(0, BLOCK_N // 2)
    tl.store(out_ptr + i, (act * u).to(dtype), mask=i < inter)


GEMV_TILE = (4, 1024, 4)  # its (BLOCK_N, BLOCK_K, num_warps): the best one setting, H100
GEMV_WIDE_ROWS = 8  # 2-byte weights of K <= GEMV_WIDE_K: BLOCK_N where that still gives
# FP8_PROGRAMS tiles unsplit (H200, 1B: qkv 6.0 -> 5.3 us, gate_up 19.2 -> 18.9, LM head 123.4
# -> 121.3; o and down, 256 tiles, would split K and slow down: 4.2 -> 6.8, 10.7 -> 13.4;
# docs/benchmarks.md 72)
GEMV_WIDE_K = 2048  # past it 8 rows lose: 8B bf16 o 11.8 us against 11.0 at 4 rows, down 33.8
# against 31.5, the step 4.41 ms against 4.35 (H200, docs/benchmarks.md 73)
GEMV_X_WIDE = True  # FP8 weights read in x's layout (_gemv_kernel's X_WIDE), no shared memory
# a step: 8B FP8 layers 10 % faster (gate_up 35.9 -> 32.8 us), TPOT 3.14 -> 3.03 ms, 1B 0.88 ->
# 0.85 (H200, docs/benchmarks.md 67)
GEMV_PRE = {1: 4}  # weight tiles loaded before the PDL wait, by weight bytes (else 1): FP8
# layers 5 % faster with 4; bf16 ones 3-5 % slower with 2 or 4 (section 59), and 1B bf16's
# step 0.91 -> 1.00 ms with 4 (8-row tiles spill; H200, docs/benchmarks.md 73)
GEMV_PRE_LONG = 4  # ... but 2-byte weights of more than GEMV_WIDE_K columns and at least
# GEMV_PRE_LONG_N outputs (4-row tiles, 1024+ of them) take this many: 8B bf16's step 4.352 ->
# 4.293 ms; not 1B's down (2048 x 8192): its step 0.908 -> 0.914 (H200, docs/benchmarks.md 73)
GEMV_PRE_LONG_N = 4096
GEMV_PRE_SHORT = 2  # ... and 2-byte weights of at most GEMV_WIDE_K columns in GEMV_TILE's
# narrow tiles (too few outputs for eight-row ones: 1B's o) this many, a whole row of 2048 before
# the wait (95 registers either way): 1B bf16's step 0.902 -> 0.894 ms (H200, benchmarks.md 75)
GEMV_PRE_WIDE = 2  # ... and those in GEMV_WIDE_ROWS tiles (1B's qkv, gate_up, LM head) this
# many: 2, a whole row of 2048, takes 165 registers against 166 at 1 (168 -> 165 with the GLU;
# sm_90, offline), so 1B's 384 qkv programs still run in one wave. 1B bf16 step, H200: 0.883 ->
# 0.871 ms against 1 (docs/benchmarks.md 76)
GEMV_GLU = True  # a one-row step's MLP: SiLU(gate) * up in gate_up's gemv (gemv's ``glu``), no
# silu_mul launch; the same bits. GPU time a step, H200: 1B bf16 0.909 -> 0.898 ms, 8B bf16 4.261
# -> 4.200, 1B FP8 0.877 -> 0.867, 8B FP8 3.115 -> 3.111 (docs/benchmarks.md 75). (RoPE and the
# KV write in qkv's gemv the same way were slower, 0.909 -> 0.936 at 1B: removed)


def _default_tile(n: int, k: int, weight_bytes: int) -> tuple[int, int, int]:
    """:data:`GEMV_TILE`, or for 2-byte weights of at most :data:`GEMV_WIDE_K` columns with at
    least ``FP8_PROGRAMS`` tiles of :data:`GEMV_WIDE_ROWS` outputs, that many outputs a
    program."""
    wide = k <= GEMV_WIDE_K and triton.cdiv(n, GEMV_WIDE_ROWS) >= FP8_PROGRAMS
    if weight_bytes == 2 and wide:
        return (GEMV_WIDE_ROWS, *GEMV_TILE[1:])
    return GEMV_TILE


def _default_pre(n: int, k: int, weight_bytes: int) -> int:
    """Weight tiles a program reads before the PDL wait: :data:`GEMV_PRE` by the weights'
    bytes, or :data:`GEMV_PRE_LONG` for 2-byte weights [n, k] longer than :data:`GEMV_WIDE_K`
    with at least :data:`GEMV_PRE_LONG_N` outputs; for 2-byte ones of at most
    :data:`GEMV_WIDE_K` columns :data:`GEMV_PRE_SHORT` in :data:`GEMV_TILE`'s tiles and
    :data:`GEMV_PRE_WIDE` in wide ones."""
    if weight_bytes == 2 and k > GEMV_WIDE_K and n >= GEMV_PRE_LONG_N:
        return GEMV_PRE_LONG
    if weight_bytes == 2 and k <= GEMV_WIDE_K:
        return GEMV_PRE_SHORT if _default_tile(n, k, 2) == GEMV_TILE else GEMV_PRE_WIDE
    return GEMV_PRE.get(weight_bytes, 1)


def gemv(
    x2: torch.Tensor,
    w: torch.Tensor,
    scale: torch.Tensor | None,
    bias: torch.Tensor | None,
    count: torch.Tensor | None = None,
    blocks: tuple[int, ...] | None = None,
    pdl: bool = False,
    out: torch.Tensor | None = None,
    glu: bool = False,
) -> torch.Tensor:
    """One row x2 [1, K] times w [N, K] (FP8 with ``scale`` [N] float32, or unscaled in x2's
    dtype) plus ``bias`` [N] -> [1, N] in x2's dtype, on the CUDA cores (:func:`_gemv_kernel`):
    at one row a step only streams the weights, and FMAs over the widened tile read them
    faster than the MMA kernel's 16-row tiles do. ``blocks``: (BLOCK_N, BLOCK_K, num_warps[,
    SPLIT[, PRE]]; None: :func:`_default_tile`); SPLIT 0 or absent: K is split until there are
    :data:`FP8_PROGRAMS` programs; PRE: weight tiles read before the PDL wait (absent:
    :func:`_default_pre`). ``count``: as :func:`fp8_linear`'s. ``pdl``: as
    :func:`add_rms_norm`'s. ``out``: where to write (N contiguous values in x2's dtype; None: a
    new [1, N]). ``glu``: w is an MLP's gate_up (gate rows first, N even) and the result is
    SiLU(gate) * up [1, N / 2], bit for bit :func:`silu_mul` of the plain result, with no
    launch of its own (K is then never split)."""
    m, k = x2.shape
    assert m == 1 and x2.stride(-1) == 1, x2.shape
    n = w.shape[0]
    blocks = blocks or _default_tile(n, k, w.element_size())
    bn, bk, warps = blocks[:3]
    split = blocks[3] if len(blocks) > 3 else 0
    pre = blocks[4] if len(blocks) > 4 else _default_pre(n, k, w.element_size())
    width = n // 2 if glu else n  # outputs
    tiles = triton.cdiv(width, bn // 2 if glu else bn)
    assert not glu or (n % 2 == 0 and bn % 2 == 0 and split <= 1), (n, blocks)
    if not split:
        split = 1 if glu else _split_rule(tiles, k)
    if out is None:
        out = torch.empty(1, width, dtype=x2.dtype, device=x2.device)
    assert out.is_contiguous() and out.numel() == width and out.dtype == x2.dtype
    k_per_split, split, part, count = _split_k(out.view(1, width), k, split, bk, tiles, count)
    _gemv_kernel[(tiles, 1, split)](
        x2,
        w,
        w if scale is None else scale,
        w if bias is None else bias,
        out,
        part,
        w if count is None else count,
        n,
        k,
        k_per_split,
        HAS_SCALE=scale is not None,
        HAS_BIAS=bias is not None,
        SPLIT=split,
        BLOCK_N=bn,
        BLOCK_K=bk,
        PRE=pre,
        X_WIDE=GEMV_X_WIDE and w.element_size() == 1,
        GLU=glu,
        PDL=pdl,
        num_warps=warps,
        num_stages=1,
        launch_pdl=pdl,
    )
    return out
