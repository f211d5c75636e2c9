"""One row times a weight matrix on the CUDA cores (:func:`gemv`): FP8 weights widened in
registers, or unscaled bf16 / fp16 ones. At one row a step only streams the weights, and
FMAs read them faster than the tensor cores' 16-row tiles do.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from voicert.engine.gpu.kernels.common import (
    FP8_PROGRAMS,
    _pdl_enter,
    _rotate,
    _scale_bias,
    _split_k,
    _split_k_finish,
    _split_rule,
    _to_pool,
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
    cos_ptr,
    sin_ptr,
    pos_ptr,
    slot_ptr,
    k_ptr,
    v_ptr,
    n_pos,
    n_q_heads,
    kvh_n,
    HAS_SCALE: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    SPLIT: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PRE: tl.constexpr,
    X_WIDE: tl.constexpr,
    GLU: tl.constexpr,
    D: tl.constexpr,
    KV_FP8: tl.constexpr,
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
    and their up rows, paired, and writes SiLU(gate) * up [N / 2] (:func:`_glu_finish`). D (a
    head dim; 0: none; K not split): w is an attention's qkv [(H + 2 KVH) * D, K]; a program
    takes BN / 2 rotation pairs (d, d + D / 2) of one head and does :func:`rope_kv_write`'s work
    for them (:func:`_rope_finish`)."""
    pid_n, pid_k = tl.program_id(0), tl.program_id(2)
    if GLU:  # rows j: gate i, up i, gate i + 1, up i + 1, ... (i = the program's first output)
        j = tl.arange(0, BLOCK_N)
        rn = pid_n * (BLOCK_N // 2) + j // 2 + (j % 2) * (N // 2)
    elif D > 0:  # rows j: head h's d, d + D / 2, d + 1, d + 1 + D / 2, ...
        j = tl.arange(0, BLOCK_N)
        rn = pid_n * BLOCK_N // D * D + (pid_n % (D // BLOCK_N)) * (BLOCK_N // 2) + j // 2
        rn += (j % 2) * (D // 2)
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
    if D > 0:  # the position and its slot: no kernel of the step writes them. (Its cos and sin
        # are read after the sums: held across the loop they took 1B's program from 166 to 222
        # registers, 3 -> 2 programs an SM, two waves of its 384 qkv programs; sm_90, offline)
        p = tl.minimum(tl.load(pos_ptr), n_pos - 1)
        half = (pid_n % (D // BLOCK_N)) * (BLOCK_N // 2) + tl.arange(0, BLOCK_N // 2)
        slot = tl.load(slot_ptr).to(tl.int64)
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
    if GLU or D > 0:  # paired rows: finished and rounded as the plain store rounds, then split
        y = _scale_bias(tl.sum(acc, axis=1), s_ptr, b_ptr, rn, nm, HAS_SCALE, HAS_BIAS)
        y = y.to(out_ptr.dtype.element_ty).to(tl.float32)
        y1, y2 = tl.split(tl.reshape(y, (BLOCK_N // 2, 2)))  # [BN / 2] each: rows j even, odd
        if GLU:
            _glu_finish(y1, y2, N // 2, out_ptr, BLOCK_N)
        else:
            c = tl.load(cos_ptr + p * (D // 2) + half).to(tl.float32)
            sn = tl.load(sin_ptr + p * (D // 2) + half).to(tl.float32)
            _rope_finish(y1, y2, c, sn, slot, half, pid_n * BLOCK_N // D, n_q_heads, kvh_n,
                         out_ptr, k_ptr, v_ptr, D, KV_FP8)  # fmt: skip
    else:
        rm = tl.arange(0, 1)
        _split_k_finish(
            tl.sum(acc, axis=1)[None, :], rm, rn, rm < 1, nm, 1, N, s_ptr, b_ptr, out_ptr,
            part_ptr, count_ptr, SPLIT, HAS_SCALE, HAS_BIAS,
        )  # fmt: skip


@triton.jit
def _rope_finish(
    x1,
    x2,
    c,
    sn,
    slot,
    half,
    head,
    n_q_heads,
    kvh_n,
    out_ptr,
    k_ptr,
    v_ptr,
    D: tl.constexpr,
    KV_FP8: tl.constexpr,
):
    """A qkv program's finished outputs, paired: columns ``half`` [BN / 2] (x1) and half + D / 2
    (x2) of head ``head``, as :func:`rope_kv_write` leaves them: a q or k head rotated by the
    position's cos ``c`` and sin ``sn`` [BN / 2] and stored in out (the step's qkv), a k or v
    head also written at ``slot`` of its pool (bf16 or FP8), bit for bit."""
    dtype = out_ptr.dtype.element_ty
    r1, r2 = _rotate(x1, x2, c, sn, dtype)
    turn = head < n_q_heads + kvh_n  # q and k heads turn; v heads are written as they are
    o1, o2 = tl.where(turn, r1, x1.to(dtype)), tl.where(turn, r2, x2.to(dtype))
    dst = out_ptr + head * D + half
    tl.store(dst, o1)
    tl.store(dst + D // 2, o2)
    kv = head - n_q_heads  # 0 .. 2 KVH - 1: k heads, then v heads
    is_k = (kv >= 0) & (kv < kvh_n)
    is_v = kv >= kvh_n
    row = (slot * kvh_n + tl.where(is_v, kv - kvh_n, kv)) * D + half  # [BN / 2]
    k_mask = is_k & (half >= 0)  # (the head's scalar test as a [BN / 2] mask)
    v_mask = is_v & (half >= 0)
    tl.store(k_ptr + row, _to_pool(o1, k_ptr, KV_FP8), mask=k_mask)
    tl.store(k_ptr + row + D // 2, _to_pool(o2, k_ptr, KV_FP8), mask=k_mask)
    tl.store(v_ptr + row, _to_pool(o1, v_ptr, KV_FP8), mask=v_mask)
    tl.store(v_ptr + row + D // 2, _to_pool(o2, v_ptr, KV_FP8), mask=v_mask)


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
GEMV_ROPE = False  # a one-row step's RoPE and KV write in the qkv gemv (gemv's ``rope``), no
# rope_kv_write launch (1.9 us a layer without PDL on the 1B step, docs/benchmarks.md 72); the
# same bits. Off until timed (docs/benchmarks.md 74)
GEMV_GLU = False  # a one-row step's MLP: SiLU(gate) * up in gate_up's gemv (gemv's ``glu``), no
# silu_mul launch (1.3 us a layer without PDL on the 1B step, docs/benchmarks.md 72); the same
# bits. Off until timed (docs/benchmarks.md 74)


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
    with at least :data:`GEMV_PRE_LONG_N` outputs."""
    if weight_bytes == 2 and k > GEMV_WIDE_K and n >= GEMV_PRE_LONG_N:
        return GEMV_PRE_LONG
    return GEMV_PRE.get(weight_bytes, 1)


class GemvRope(NamedTuple):
    """What a qkv gemv needs to do :func:`rope_kv_write`'s work itself: the model's cos and sin
    tables [P, D/2], the step's one position [1] and slot [1] (int64), the layer's k and v pools
    [NB, BS, KVH, D] (the qkv's dtype or FP8, not int8), and the heads."""

    cos: torch.Tensor
    sin: torch.Tensor
    positions: torch.Tensor
    slots: torch.Tensor
    k_pool: torch.Tensor
    v_pool: torch.Tensor
    num_heads: int
    num_kv_heads: int


def rope_fits(w: torch.Tensor, head_dim: int) -> bool:
    """Whether :func:`gemv` can take a qkv w [N, K]'s RoPE and KV write (``rope``): its default
    tile's outputs divide the head dim."""
    bn = _default_tile(w.shape[0], w.shape[1], w.element_size())[0]
    return head_dim % bn == 0


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
    rope: GemvRope | None = None,
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
    launch of its own (K is then never split). ``rope`` (:func:`rope_fits`): w is an
    attention's qkv and the launch does :func:`rope_kv_write`'s work for the step's one token,
    bit for bit (q and k rotated in the result, k and v written to the pools; K never split)."""
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
    d = 0 if rope is None else n // (rope.num_heads + 2 * rope.num_kv_heads)
    assert rope is None or (not glu and d % bn == 0 and bn > 1 and split <= 1), (d, blocks)
    assert rope is None or rope.k_pool.dtype != torch.int8, "an int8 pool: rope_kv_write"
    if not split:
        split = 1 if glu or rope is not None else _split_rule(tiles, k)
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
        *(w,) * 6 if rope is None else rope[:6],
        1 if rope is None else rope.cos.shape[0],
        0 if rope is None else rope.num_heads,
        0 if rope is None else rope.num_kv_heads,
        HAS_SCALE=scale is not None,
        HAS_BIAS=bias is not None,
        SPLIT=split,
        BLOCK_N=bn,
        BLOCK_K=bk,
        PRE=pre,
        X_WIDE=GEMV_X_WIDE and w.element_size() == 1,
        GLU=glu,
        D=d,
        KV_FP8=rope is not None and rope.k_pool.dtype == torch.float8_e4m3fn,
        PDL=pdl,
        num_warps=warps,
        num_stages=1,
        launch_pdl=pdl,
    )
    return out
