"""Linears over packed INT4 weights (engine/gpu/int4.py). :func:`int4_linear` picks a path by
rows and shape (:func:`int4_path`): one or two rows on the CUDA cores (:func:`int4_gemv`;
with ``a8`` x rounded to int8 by group, W4A8), the groups' sums on the tensor cores, scaled
or widened tiles, or the weights widened whole for cuBLAS (:func:`int4_dequantize`). A
one-row x is first laid out in planes (:func:`int4_planes`, :func:`int4_a8_planes`), or by
the norms that write it (norms.py).
"""

from __future__ import annotations

import enum

import torch
import triton
import triton.language as tl

from voicert.engine.gpu.kernels.common import (
    FP8_MIN_SPLIT_K,
    _fp8_dot,
    _pdl_enter,
    _pow2,
    _split_k,
    _split_k_finish,
    _split_rule,
)

# ----------------------------------------------------------------------------- INT4 weights


@triton.jit
def _int4_group(
    acc,
    p,
    x_ptrs,
    l_ptrs,
    s_ptrs,
    mm,
    nm,
    HALF: tl.constexpr,
    MAGIC: tl.constexpr,
    SWAP: tl.constexpr,
    IEEE: tl.constexpr,
    SCALED: tl.constexpr,
):
    """acc + one group's products: packed codes p [BN, HALF] uint8 (byte j: the group's column j
    in the low nibble, column j + HALF in the high one), x at x_ptrs [BM, HALF] (the group's
    first half; the second at + HALF), the group's low and scale per output row at l_ptrs,
    s_ptrs [BN]. acc is [BM, BN], or [BN, BM] with ``SWAP`` (the weights as the MMA's first
    operand). ``SCALED``: each weight widened whole in registers, code * scale + low in fp32
    rounded once to x's dtype (:func:`int4_dequantize`'s values), and summed straight into acc
    (one accumulator: the many-row path). Else the group's sum over the bare codes, then
    scale * sum(x * code) + low * sum(x): ``MAGIC`` 1 (bf16 x) / 2 (fp16 x) widens each code by
    its bits alone, ``0x4300 | code`` being the bf16 128 + code (fp16: ``0x6400 | code``, 1024
    + code), the offset taken off the group's sum once, as offset * sum(x); 0: the code
    converted (exact in any float dtype)."""
    low = tl.load(l_ptrs, mask=nm, other=0.0).to(tl.float32)  # [BN]
    s = tl.load(s_ptrs, mask=nm, other=0.0).to(tl.float32)
    xa = tl.load(x_ptrs, mask=mm[:, None], other=0.0)  # [BM, HALF]
    xb = tl.load(x_ptrs + HALF, mask=mm[:, None], other=0.0)
    if SCALED:
        acc = _int4_scaled_group(acc, p, xa, xb, low, s, SWAP, IEEE)
    else:
        if MAGIC == 0:
            lo = (p & 15).to(xa.dtype)  # [BN, HALF]: the codes, exact
            hi = (p >> 4).to(xa.dtype)
            offset: tl.constexpr = 0.0
        else:
            bits: tl.constexpr = 0x4300 if MAGIC == 1 else 0x6400
            offset: tl.constexpr = 128.0 if MAGIC == 1 else 1024.0
            p16 = p.to(tl.int16)
            lo = ((p16 & 15) | bits).to(tl.int16).to(xa.dtype, bitcast=True)  # [BN, HALF]
            hi = ((p16 >> 4) | bits).to(tl.int16).to(xa.dtype, bitcast=True)
        part = tl.zeros(acc.shape, dtype=tl.float32)
        xs = tl.sum(xa.to(tl.float32), axis=1) + tl.sum(xb.to(tl.float32), axis=1)  # [BM]
        if SWAP:
            part = _fp8_dot(lo, xa, part, IEEE)  # [BN, BM]
            part = _fp8_dot(hi, xb, part, IEEE)
            acc += (part - offset * xs[None, :]) * s[:, None] + low[:, None] * xs[None, :]
        else:
            part = _fp8_dot(xa, lo, part, IEEE)  # [BM, BN]
            part = _fp8_dot(xb, hi, part, IEEE)
            acc += (part - xs[:, None] * offset) * s[None, :] + xs[:, None] * low[None, :]
    return acc


@triton.jit
def _int4_widen(code, s, low):
    """code * s + low in fp32 for int32 codes in [0, 15]: a code becomes 2^23 + code by its bits
    (``0x4B000000 | code`` as fp32), less 2^23 exactly; code * s is exact in fp32, the sum with
    the low is rounded once (the caller rounds it once more, to x's dtype)."""
    return ((code | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0) * s + low


@triton.jit
def _int4_scaled_group(acc, p, xa, xb, low, s, SWAP: tl.constexpr, IEEE: tl.constexpr):
    """acc + a group's products with its weights widened whole (:func:`_int4_widen`): p [BN,
    HALF] uint8 codes, xa / xb [BM, HALF] the group's two halves of x, low / s [BN] fp32."""
    p32 = p.to(tl.int32)
    lo = _int4_widen(p32 & 15, s[:, None], low[:, None]).to(xa.dtype)  # [BN, HALF]
    hi = _int4_widen(p32 >> 4, s[:, None], low[:, None]).to(xa.dtype)
    if SWAP:  # (no early return: Triton compiles the rest of a constexpr branch's function too)
        acc = _fp8_dot(lo, xa, acc, IEEE)  # [BN, BM]
        acc = _fp8_dot(hi, xb, acc, IEEE)
    else:
        acc = _fp8_dot(xa, lo, acc, IEEE)  # [BM, BN]
        acc = _fp8_dot(xb, hi, acc, IEEE)
    return acc


@triton.jit
def _int4_linear_kernel(
    x_ptr,
    w_ptr,
    s_ptr,
    l_ptr,
    b_ptr,
    out_ptr,
    part_ptr,
    count_ptr,
    M,
    N,
    K,
    stride_xm,
    k_per_split,
    HAS_BIAS: tl.constexpr,
    IEEE: tl.constexpr,
    SPLIT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    GROUP: tl.constexpr,
    MAGIC: tl.constexpr,
    SWAP: tl.constexpr,
    SCALED: tl.constexpr,
    PDL: tl.constexpr,
):
    pid_n, pid_m, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    if SCALED:  # M first in the grid: one weight tile's programs run together, it is read once
        pid_n, pid_m = tl.program_id(1), tl.program_id(0)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    HALF: tl.constexpr = GROUP // 2
    half = tl.arange(0, HALF)
    mm, nm = rm < M, rn < N
    groups = K // GROUP
    k_lo = pid_k * k_per_split  # a multiple of GROUP
    k_hi = tl.minimum(k_lo + k_per_split, K)
    w_ptrs = w_ptr + rn[:, None].to(tl.int64) * (K // 2) + (k_lo // 2 + half)[None, :]
    x_ptrs = x_ptr + rm[:, None].to(tl.int64) * stride_xm + (k_lo + half)[None, :]
    l_ptrs = l_ptr + rn.to(tl.int64) * groups + k_lo // GROUP  # [BN]
    s_ptrs = s_ptr + rn.to(tl.int64) * groups + k_lo // GROUP
    if SWAP:
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    # the first group's codes are read before waiting for the kernel before (PDL), as FP8's
    p = tl.load(w_ptrs, mask=nm[:, None], other=0)
    _pdl_enter(PDL)
    acc = _int4_group(acc, p, x_ptrs, l_ptrs, s_ptrs, mm, nm, HALF, MAGIC, SWAP, IEEE, SCALED)
    for _k0 in range(k_lo + GROUP, k_hi, GROUP):
        w_ptrs += GROUP // 2
        x_ptrs += GROUP
        l_ptrs += 1
        s_ptrs += 1
        p = tl.load(w_ptrs, mask=nm[:, None], other=0)
        acc = _int4_group(acc, p, x_ptrs, l_ptrs, s_ptrs, mm, nm, HALF, MAGIC, SWAP, IEEE, SCALED)
    if SWAP:
        acc = tl.trans(acc)  # [BM, BN]
    _split_k_finish(
        acc, rm, rn, mm, nm, M, N, s_ptr, b_ptr, out_ptr, part_ptr, count_ptr,
        SPLIT, False, HAS_BIAS,
    )  # fmt: skip


@triton.jit
def _int4_planes_kernel(
    x_ptr, p_ptr, K, XS, stride_x, GROUP: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr
):
    """Rows of x [M, K] (row stride ``stride_x``) -> :func:`_int4_gemv_kernel`'s planes [M, 10,
    XS] fp32 (XS >= K // 8), BLOCK columns of a row a program (:func:`_int4_planes_put`)."""
    row = tl.program_id(1).to(tl.int64)
    c0 = tl.program_id(0) * BLOCK
    cols = c0 + tl.arange(0, BLOCK)
    _pdl_enter(PDL)
    x = tl.load(x_ptr + row * stride_x + cols, mask=cols < K, other=0.0).to(tl.float32)
    _int4_planes_put(p_ptr + row * 10 * XS, XS, x, c0, K, GROUP, BLOCK)


@triton.jit
def _int4_planes_put(p_ptr, XS, y, c0, K, GROUP: tl.constexpr, BLOCK: tl.constexpr):
    """Columns c0..c0 + BLOCK of one row, y [BLOCK] fp32 (c0 a multiple of GROUP; 0 past K),
    into the planes [10, XS] that :func:`_int4_gemv_kernel` reads: for each packed word of a
    weight row (its low nibbles columns c..c+3 of a group's first half, its high ones
    c + HALF..), plane j holds the x of the code at bits 4j..4j+3 (column j // 2 of the four, +
    HALF for odd j), pre-scaled by 2^(23 - p) for the bit p the gemv reads it at (11, 15 or
    19: j % 3 picks 4096, 256 or 16); plane 8 less the word's sum of those (-sum(x'), where the
    gemv's sums start), plane 9 its sum of x. The kernels that write x for an INT4 Linear
    (:func:`add_rms_norm`, :func:`silu_mul`) call this too, so their planes are these, bit for
    bit."""
    HALF: tl.constexpr = GROUP // 2
    WPG: tl.constexpr = GROUP // 8
    G: tl.constexpr = BLOCK // GROUP
    cols = c0 + tl.arange(0, BLOCK)
    r = cols % GROUP
    b = r % HALF
    j = 2 * (b % 4) + r // HALF  # the plane
    at = (cols // GROUP) * WPG + b // 4  # the word
    ys = y * tl.where(j % 3 == 0, 4096.0, tl.where(j % 3 == 1, 256.0, 16.0))
    tl.store(p_ptr + j * XS + at, ys, mask=cols < K)
    xs = _word_sums(y, G, WPG)  # [G, WPG]
    xp = _word_sums(ys, G, WPG)
    wi = (c0 // GROUP + tl.arange(0, G))[:, None] * WPG + tl.arange(0, WPG)[None, :]
    tl.store(p_ptr + 8 * XS + wi, -xp, mask=wi < K // 8)
    tl.store(p_ptr + 9 * XS + wi, xs, mask=wi < K // 8)


@triton.jit
def _word_sums(v, G: tl.constexpr, WPG: tl.constexpr):
    """v [G * GROUP] fp32 -> [G, WPG]: each packed word's sum of its eight columns (a group's
    half h, word w, column c of four at h * HALF + 4w + c), added in one fixed order:
    ((c0 + c1) + (c2 + c3)) per half, then low half + high half. tl.sum's order follows the
    threads' layout, which may differ between the kernels that call this (other BLOCKs and
    warps); elementwise adds of split halves take the same order in each."""
    t = tl.reshape(v, (G, 2, WPG, 2, 2))  # [g, half, word, pair, column of the pair]
    a, b = tl.split(t)
    a, b = tl.split(a + b)  # [g, half, word]: c0 + c1 and c2 + c3
    a, b = tl.split(tl.permute(a + b, (0, 2, 1)))  # [g, word]: each half's sum
    return a + b


@triton.jit
def _int4_gemv_kernel(
    p_ptr,
    w_ptr,
    s_ptr,
    l_ptr,
    b_ptr,
    out_ptr,
    part_ptr,
    count_ptr,
    N,
    K: tl.constexpr,
    k_per_split,
    ONE,
    HAS_BIAS: tl.constexpr,
    SPLIT: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_G: tl.constexpr,
    GROUP: tl.constexpr,
    EVEN: tl.constexpr,
    UNROLL: tl.constexpr,
    A8: tl.constexpr,
    EMULATE: tl.constexpr,
    PDL: tl.constexpr,
):
    """:func:`_int4_linear_kernel` for one row on the CUDA cores, no MMA (:func:`int4_gemv`).
    w_ptr: the packed codes read as int32 words [N, W = K // 8]; word i of a row holds bytes
    4i..4i+3, so (a group's HALF bytes being a whole number of words) its four low nibbles are
    columns c..c+3 of one group's first half and its four high nibbles c + HALF..c + HALF + 3.
    p_ptr: x as :func:`_int4_planes_kernel` lays it out, [10, K // 8] fp32.

    A program (one warp: its loads need no layout conversion, which costs shared memory and
    barriers every step) takes BLOCK_N rows and BLOCK_G groups a K step: words [BG, BN, WPG]
    (groups first, so that one thread holds the same words of each of its rows) and the planes
    [BG, 1, WPG] in the same layout, read once for all the rows. The words are read two steps
    ahead, in registers (Triton's pipeliner, through shared memory, was slower: docs/
    benchmarks.md 64). A partial sum per word; no reduction across threads in the loop.
    ``EVEN``: N a multiple of BN and K of a step (no masks, but on the reads ahead).

    Each code is widened by bit operations alone: a nibble at bits p..p+3, p in {11, 15, 19}
    (inside fp32's 23 mantissa bits), or'ed into 1.0's bits is the fp32 1 + code * 2^(p - 23),
    exact. The word shifted 11 left, 1 right and 13 right brings its eight nibbles to those
    places (three shifts a word, then one AND-OR a code). With x's column pre-scaled by
    2^(23 - p) (exact), the word's products from -sum(x') sum to t = sum(x * code), the sum over
    the bare codes, scaled once: scale * t + low * sum(x). The codes' products are 2^-11 of
    sum(x')'s terms or more: the sums keep ~2^-15 of relative precision in fp32 (the MMA
    kernel's, ~2^-22; bf16's rounding is 2^-9).

    ``A8`` (:func:`int4_gemv_a8`): x rounded to int8 by group instead, p_ptr its planes [4,
    K // 8] int32 (:func:`_int4_a8_planes_put`), each step's sums by :func:`_int4_a8_step`;
    ``EMULATE``: its dp4a by shifts (Triton's interpreter)."""
    WPG: tl.constexpr = GROUP // 8  # words a group
    STEP: tl.constexpr = BLOCK_G * WPG  # words a row a step
    W: tl.constexpr = K // 8  # words a weight row, and values a plane (a constant: the reads
    # share one address register, with immediate offsets)
    pid_n, pid_k = tl.program_id(0), tl.program_id(2)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # [BN]
    rg = tl.arange(0, BLOCK_G)
    rw = tl.arange(0, WPG)
    nm = rn < N
    groups = K // GROUP
    g_lo = pid_k * (k_per_split // GROUP)
    g_hi = tl.minimum(g_lo + k_per_split // GROUP, groups)
    gw = (g_lo + rg)[:, None, None] * WPG + rw[None, None, :]  # [BG, 1, WPG]: places in a row
    w_ptrs = w_ptr + rn[None, :, None].to(tl.int64) * W + gw  # [BG, BN, WPG]
    p_ptrs = p_ptr + gw
    sl_at = rn[None, :].to(tl.int64) * groups + (g_lo + rg)[:, None]  # [BG, BN]
    wm = ((g_lo + rg) < g_hi)[:, None, None] & nm[None, :, None]  # (unused when EVEN)
    v = tl.load(w_ptrs, mask=None if EVEN else wm)  # the first two steps before the wait
    ahead = g_lo + BLOCK_G < g_hi
    wm = ((g_lo + BLOCK_G + rg) < g_hi)[:, None, None] & nm[None, :, None]
    v1 = tl.load(w_ptrs + STEP, mask=ahead if EVEN else wm)
    _pdl_enter(PDL)
    acc = tl.zeros((BLOCK_G, BLOCK_N, WPG), dtype=tl.float32)
    for g0 in tl.range(g_lo, g_hi, BLOCK_G, loop_unroll_factor=UNROLL):
        ahead = g0 + 2 * BLOCK_G < g_hi
        wm = ((g0 + 2 * BLOCK_G + rg) < g_hi)[:, None, None] & nm[None, :, None]
        v2 = tl.load(w_ptrs + 2 * STEP, mask=ahead if EVEN else wm)
        gm = (g0 + rg) < g_hi
        m2 = gm[:, None] & nm[None, :]
        if EVEN:
            s = tl.load(s_ptr + sl_at).to(tl.float32)[:, :, None]  # [BG, BN, 1]
            low = tl.load(l_ptr + sl_at).to(tl.float32)[:, :, None]
        else:
            s = tl.load(s_ptr + sl_at, mask=m2, other=0.0).to(tl.float32)[:, :, None]
            low = tl.load(l_ptr + sl_at, mask=m2, other=0.0).to(tl.float32)[:, :, None]
        pm = None if EVEN else gm[:, None, None]
        if A8:
            sx_ptrs = p_ptr + 3 * W + (g0 + rg)[:, None, None]  # [BG, 1, 1]: the groups' scales
            acc = _int4_a8_step(acc, v, p_ptrs, sx_ptrs, W, s, low, pm, EMULATE)
        else:
            acc = _int4_gemv_step(acc, v, p_ptrs, W, s, low, ONE, pm)
        v, v1 = v1, v2
        w_ptrs += STEP
        p_ptrs += STEP
        sl_at += BLOCK_G
    rm = tl.arange(0, 1)
    _split_k_finish(
        tl.sum(tl.sum(acc, axis=2), axis=0)[None, :], rm, rn, rm < 1, nm, 1, N, s_ptr, b_ptr,
        out_ptr, part_ptr, count_ptr, SPLIT, False, HAS_BIAS,
    )  # fmt: skip


@triton.jit
def _int4_gemv_rows_kernel(
    p_ptr,
    w_ptr,
    s_ptr,
    l_ptr,
    b_ptr,
    out_ptr,
    part_ptr,
    count_ptr,
    M,
    N,
    K: tl.constexpr,
    k_per_split,
    ONE,
    HAS_BIAS: tl.constexpr,
    SPLIT: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_G: tl.constexpr,
    GROUP: tl.constexpr,
    PDL: tl.constexpr,
):
    """:func:`_int4_gemv_kernel` for M rows of x at once, M <= ROWS (a power of two): each
    word's codes widened once for every row, the weights read once. p_ptr: the rows' planes,
    [ROWS, 10, K // 8] (rows past M: zeros, their sums are not stored); out [M, N]. Tiles [BG,
    BN, ROWS, WPG]: the words [BG, BN, 1, WPG] and the planes [BG, 1, ROWS, WPG] in one layout
    (no conversion a step). Whole steps only (N a multiple of BN, K of a step)."""
    WPG: tl.constexpr = GROUP // 8
    STEP: tl.constexpr = BLOCK_G * WPG
    W: tl.constexpr = K // 8  # words a weight row, and values a plane
    pid_n, pid_k = tl.program_id(0), tl.program_id(2)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # [BN]
    rr = tl.arange(0, ROWS)
    rg = tl.arange(0, BLOCK_G)
    rw = tl.arange(0, WPG)
    groups = K // GROUP
    g_lo = pid_k * (k_per_split // GROUP)
    g_hi = tl.minimum(g_lo + k_per_split // GROUP, groups)
    gw = (g_lo + rg)[:, None, None, None] * WPG + rw[None, None, None, :]  # [BG, 1, 1, WPG]
    w_ptrs = w_ptr + rn[None, :, None, None].to(tl.int64) * W + gw  # [BG, BN, 1, WPG]
    p_ptrs = p_ptr + rr[None, None, :, None] * (10 * W) + gw  # [BG, 1, ROWS, WPG]
    sl_at = rn[None, :].to(tl.int64) * groups + (g_lo + rg)[:, None]  # [BG, BN]
    v = tl.load(w_ptrs)  # the first two steps before the wait
    v1 = tl.load(w_ptrs + STEP, mask=g_lo + BLOCK_G < g_hi)
    _pdl_enter(PDL)
    acc = tl.zeros((BLOCK_G, BLOCK_N, ROWS, WPG), dtype=tl.float32)
    for g0 in range(g_lo, g_hi, BLOCK_G):
        v2 = tl.load(w_ptrs + 2 * STEP, mask=g0 + 2 * BLOCK_G < g_hi)
        s = tl.load(s_ptr + sl_at).to(tl.float32)[:, :, None, None]  # [BG, BN, 1, 1]
        low = tl.load(l_ptr + sl_at).to(tl.float32)[:, :, None, None]
        acc = _int4_gemv_step(acc, v, p_ptrs, W, s, low, ONE, None)
        v, v1 = v1, v2
        w_ptrs += STEP
        p_ptrs += STEP
        sl_at += BLOCK_G
    _split_k_finish(
        tl.trans(tl.sum(tl.sum(acc, axis=3), axis=0)), rr, rn, rr < M, rn < N, M, N,
        s_ptr, b_ptr, out_ptr, part_ptr, count_ptr, SPLIT, False, HAS_BIAS,
    )  # fmt: skip


@triton.jit
def _int4_gemv_step(acc, v, p_ptrs, XS, s, low, ONE, pm):
    """acc [BG, BN, WPG] + one step's words v (same shape) against the planes at p_ptrs [BG, 1,
    WPG] (mask pm, or None), scaled by s / low [BG, BN, 1]: :func:`_int4_gemv_kernel`'s sums."""
    t = _int4_plane(p_ptrs + 8 * XS, pm)  # -sum(x')
    a = v << 11  # bits 0, 4, 8 at 11, 15, 19
    b = v >> 1  # bits 12, 16, 20 (the sign bits shifted in are masked off)
    c = v >> 13  # bits 24, 28 at 11, 15
    t = _int4_one(a, 11, _int4_plane(p_ptrs, pm), ONE, t)  # [BG, BN, WPG]
    t = _int4_one(a, 15, _int4_plane(p_ptrs + XS, pm), ONE, t)
    t = _int4_one(a, 19, _int4_plane(p_ptrs + 2 * XS, pm), ONE, t)
    t = _int4_one(b, 11, _int4_plane(p_ptrs + 3 * XS, pm), ONE, t)
    t = _int4_one(b, 15, _int4_plane(p_ptrs + 4 * XS, pm), ONE, t)
    t = _int4_one(b, 19, _int4_plane(p_ptrs + 5 * XS, pm), ONE, t)
    t = _int4_one(c, 11, _int4_plane(p_ptrs + 6 * XS, pm), ONE, t)
    t = _int4_one(c, 15, _int4_plane(p_ptrs + 7 * XS, pm), ONE, t)
    return acc + s * t + low * _int4_plane(p_ptrs + 9 * XS, pm)  # (plane 9: sum(x))


@triton.jit
def _int4_a8_step(acc, v, p_ptrs, sx_ptrs, XS, s, low, pm, EMULATE: tl.constexpr):
    """acc [BG, BN, WPG] + one step's words v (same shape) against W4A8's planes at p_ptrs [BG,
    1, WPG] and the groups' scales at sx_ptrs [BG, 1, 1] (mask pm, or None), scaled by s / low
    [BG, BN, 1]: a word's eight codes against x's bytes by two ``dp4a`` (its low nibbles masked
    in place as four bytes, its high ones shifted down four), an exact int32 sum; then scale *
    sx * that + low * the word's sum of x. Eight instructions a word and row, against the fp32
    widening's ~23."""
    sx = _int4_plane(sx_ptrs, pm).to(tl.float32, bitcast=True)
    x_lo = _int4_plane(p_ptrs, pm)  # [BG, 1, WPG] int32
    x_hi = _int4_plane(p_ptrs + XS, pm)
    x_sum = _int4_plane(p_ptrs + 2 * XS, pm).to(tl.float32, bitcast=True)
    t = _dp4a(v & 0x0F0F0F0F, x_lo, None, EMULATE)
    t = _dp4a((v >> 4) & 0x0F0F0F0F, x_hi, t, EMULATE)
    acc += low * x_sum  # (two FMAs, not a product and two sums)
    acc += (s * sx) * t.to(tl.float32)
    return acc


@triton.jit
def _int4_plane(ptrs, pm):
    """A plane's values at ptrs, 0 where the mask pm (None: none) is off."""
    if pm is None:
        out = tl.load(ptrs)
    else:
        out = tl.load(ptrs, mask=pm, other=0)
    return out


@triton.jit
def _int4_one(word, P: tl.constexpr, xp, one, t):
    """t + xp [BG, 1, WPG] times the codes at bits P..P+3 of word [BG, BN, WPG], each read as the
    fp32 1 + code * 2^(P - 23): its bits or'ed into ``one``, 1.0's bits (0x3F800000) passed in
    at run time, so that the mask and it make one AND-OR (a SASS LOP3 takes one immediate)."""
    f = ((word & (15 << P)) | one).to(tl.float32, bitcast=True)
    return t + f * xp


class Int4Path(enum.Enum):
    """How :func:`int4_linear` computes a call (:func:`int4_path` chooses by shape)."""

    GROUPS = "groups"  # each group's sum over the bare codes, scaled once (decode rows)
    SCALED = "scaled"  # each weight widened whole with its scale, one accumulator (more rows)
    WIDEN = "widen"  # the weights widened into a scratch [N, K], then cuBLAS (prefill)
    GEMV = "gemv"  # one row on the CUDA cores, the codes read as words (int4_gemv)


def int4_path(m: int, n: int, k: int, group: int = 128) -> Int4Path:
    """The path for x [m, k] times weights [n, k], as measured on an H200 (docs/benchmarks.md
    58, 64, 65): up to :data:`INT4_GEMV_ROWS` rows (one: 8B batch-1 TPOT 3.91 -> 2.76 ms; two:
    3.88 -> 3.56) the CUDA cores where :func:`int4_gemv_fits`, more than one only for weights
    wider than deep (q/k/v, gate/up: two rows of 8B gate_up 47.8 -> 37.0 us, down 28.0 ->
    29.1); the scaled kernel from :data:`INT4_SCALED_ROWS` rows up to :data:`INT4_WIDEN_ROWS`
    where both of the weights' sides are at least :data:`INT4_SCALED_MIN_WIDTH` (Llama-8B's
    Linears: its four at 64 rows 167 us against 195 by groups and 301 widened; in the engine, 64
    streams 7.70-7.84 -> 6.88-6.91 ms a token); narrower weights (Llama-1B's, where the engine
    lost 0.1 ms a token at 64 streams with it) by groups up to 64 rows; more rows widened."""
    wide = min(n, k) >= INT4_SCALED_MIN_WIDTH
    if m <= INT4_GEMV_ROWS and int4_gemv_fits(m, n, k, group) and (m == 1 or n > k):
        return Int4Path.GEMV  # (more rows: only wider than deep, where they won)
    if m > (INT4_WIDEN_ROWS if wide else INT4_GROUP_ROWS):
        return Int4Path.WIDEN
    return Int4Path.SCALED if wide and m > INT4_SCALED_ROWS else Int4Path.GROUPS


def int4_blocks(
    m: int, n: int, k: int, group: int, path: Int4Path
) -> tuple[int, int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages, SPLIT_K) for :func:`int4_linear` on x [m, k] and
    weights [n, k] by ``path``: GROUPS as :func:`fp8_blocks` chooses (one M tile of up to 64
    rows), a K step being one group; SCALED :data:`INT4_MANY_ROWS_TILE`. K is split
    (:func:`int4_split`) until every SM has programs."""
    if path is Int4Path.SCALED:
        bm, bn, warps, stages = INT4_MANY_ROWS_TILE
    else:
        bn = min(INT4_GROUP_BYTES // (group // 2), 256) if m <= 16 else 64  # (a K step: a group)
        bm, warps, stages = 16 if m <= 16 else _pow2(m), 4, 4 if m <= 16 else 3
    return bm, bn, warps, stages, int4_split(m, n, k, group, bm, bn)


def int4_split(m: int, n: int, k: int, group: int, bm: int, bn: int) -> int:
    """How many parts K is split into for tiles of bm x bn: enough programs for
    :data:`FP8_PROGRAMS`, at most 16 parts, each at least ``FP8_MIN_SPLIT_K`` columns (or a
    group)."""
    tiles = triton.cdiv(n, bn) * triton.cdiv(m, bm)
    return _split_rule(tiles, k, max(FP8_MIN_SPLIT_K, group))


def int4_linear(
    x: torch.Tensor,
    w: torch.Tensor,
    scale: torch.Tensor,
    low: torch.Tensor,
    bias: torch.Tensor | None,
    count: torch.Tensor | None = None,
    blocks: tuple[int, ...] | None = None,
    pdl: bool = False,
    magic: bool = True,
    swap: bool = True,
    path: Int4Path | None = None,
    planes: torch.Tensor | None = None,
    a8: bool = False,
) -> torch.Tensor:
    """x [..., K] (bf16, fp16 or fp32) times packed INT4 weights w [N, K // 2] uint8 (engine/gpu/
    int4.py's layout) with float16 scales and lows [N, K // group], plus ``bias`` [N] -> [..., N]
    in x's dtype: sum over groups g of scale[n, g] * sum over the group's k of x[k] * code[n, k],
    plus low[n, g] * sum over the group's k of x[k], in fp32 (IEEE for fp32 inputs). ``count``:
    zeroed int32 counters, one per output tile, for a split over K (None: fresh ones).
    ``blocks`` overrides :func:`int4_blocks` (the benchmark tries others; the split is then
    chosen as by default if left out). ``pdl``: as :func:`add_rms_norm`'s.

    ``path`` (None: :func:`int4_path`'s): GROUPS, each group's sum over the bare codes, scaled
    once; ``magic``: bf16 / fp16 codes widened by their bits (else converted); ``swap``:
    the weights as the MMA's first operand. Both on: 1.4-1.9x bf16's speed at up to 16 rows on
    an H100's Llama-8B shapes against 1.2-1.6x for neither (scripts/gpu/int4_tiles.py,
    docs/benchmarks.md 46). SCALED: each weight widened whole in registers to code * scale +
    low in x's dtype (:func:`int4_dequantize`'s values) and summed into one accumulator, the
    programs of one weight tile side by side. WIDEN: the weights widened into a scratch [N, K]
    in x's dtype (:func:`int4_dequantize`), then cuBLAS. GEMV: one row (up to
    :data:`INT4_GEMV_MAX_ROWS`) on the CUDA cores (:func:`int4_gemv`, whose ``blocks`` are its
    own; ``planes``: x laid out for it already,
    given only where the path is GEMV). WIDEN and GEMV are chosen only where ``blocks`` is left
    out: with tiles and no ``path``, the MMA kernel runs by GROUPS. ``a8`` (one bf16/fp16 row:
    engine/gpu/int4.py's ``a8_rounds``): x rounded to int8 by group, on the GEMV path always
    (:func:`int4_gemv_a8`; ``planes``: its own)."""
    n, k = w.shape[0], 2 * w.shape[1]
    group = k // scale.shape[1]
    if a8:
        assert x.numel() == k and x.dtype in (torch.bfloat16, torch.float16), x.shape
        path = Int4Path.GEMV
    if path is None:
        path = int4_path(x.numel() // k, n, k, group)
        if blocks is not None and path in (Int4Path.WIDEN, Int4Path.GEMV):  # MMA tiles asked for
            path = Int4Path.GROUPS
    if path is Int4Path.WIDEN:
        wide = int4_dequantize(w, scale, low, x.dtype, pdl)
        return torch.nn.functional.linear(x, wide, bias)
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    m = x2.shape[0]
    assert planes is None or path is Int4Path.GEMV, path
    if path is Int4Path.GEMV:
        out = int4_gemv(x2, w, scale, low, bias, count, blocks, pdl, planes, a8)
        return out.view(*x.shape[:-1], n)
    scaled = path is Int4Path.SCALED
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    bm, bn, warps, stages, split = (*blocks, None)[:5] if blocks else (None,) * 5
    if bm is None:
        bm, bn, warps, stages, split = int4_blocks(m, n, k, group, path)
    elif split is None:
        split = int4_split(m, n, k, group, bm, bn)
    grid_n, grid_m = triton.cdiv(n, bn), triton.cdiv(m, bm)
    tiles = grid_n * grid_m
    k_per_split, split, part, count = _split_k(out, k, split, group, tiles, count)
    _int4_linear_kernel[(grid_m, grid_n, split) if scaled else (grid_n, grid_m, split)](
        x2,
        w,
        scale,
        low,
        w if bias is None else bias,
        out,
        part,
        w if count is None else count,
        m,
        n,
        k,
        x2.stride(0),
        k_per_split,
        HAS_BIAS=bias is not None,
        IEEE=x.dtype == torch.float32,
        SPLIT=split,
        BLOCK_M=bm,
        BLOCK_N=bn,
        GROUP=group,
        MAGIC=MAGIC_BITS.get(x.dtype, 0) if magic else 0,
        SWAP=swap,
        SCALED=scaled,
        PDL=pdl,
        num_warps=warps,
        num_stages=stages,
        launch_pdl=pdl,
    )
    return out.view(*x.shape[:-1], n)


def int4_planes(
    x2: torch.Tensor, group: int, pdl: bool = False, rows: int | None = None
) -> torch.Tensor:
    """Rows x2 [M, K] (unit column stride) laid out for :func:`int4_gemv` in groups of ``group``:
    [10, K // 8] fp32 for one row, else [rows, 10, K // 8] (``rows`` >= M; past M zeros)
    (:func:`_int4_planes_put`). ``pdl``: as :func:`add_rms_norm`'s."""
    m, k = x2.shape
    shape = (10, k // 8) if rows is None else (rows, 10, k // 8)
    assert m == 1 or (rows is not None and rows >= m), (m, rows)
    padded = rows is not None and rows > m
    planes = (torch.zeros if padded else torch.empty)(shape, dtype=torch.float32, device=x2.device)
    block = max(group, INT4_PLANES_BLOCK)
    _int4_planes_kernel[(triton.cdiv(k, block), m)](
        x2, planes, k, k // 8, x2.stride(0), GROUP=group, BLOCK=block, PDL=pdl, launch_pdl=pdl
    )
    return planes


@triton.jit
def _int4_a8_planes_kernel(
    x_ptr, p_ptr, K, XS, GROUP: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr
):
    """One row x [K] -> :func:`_int4_gemv_kernel`'s planes with ``A8`` [4, XS] int32, BLOCK columns
    (whole groups) a program (:func:`_int4_a8_planes_put`)."""
    c0 = tl.program_id(0) * BLOCK
    cols = c0 + tl.arange(0, BLOCK)
    _pdl_enter(PDL)
    x = tl.load(x_ptr + cols, mask=cols < K, other=0.0).to(tl.float32)
    _int4_a8_planes_put(p_ptr, XS, x, c0, K, GROUP, BLOCK)


@triton.jit
def _int4_a8_planes_put(p_ptr, XS, y, c0, K, GROUP: tl.constexpr, BLOCK: tl.constexpr):
    """Columns c0..c0 + BLOCK of one row, y [BLOCK] fp32 (c0 a multiple of BLOCK, BLOCK of
    GROUP; 0 past K), rounded to int8 by group with a scale each (sx: the largest magnitude
    maps to 127; ``floor(v / sx + 0.5)``), into the planes [4, XS] int32 that
    :func:`_int4_gemv_kernel` reads with ``A8``: for each packed word of a weight row (its low nibbles
    columns c..c+3 of a group's first half, its high ones c + HALF..), plane 0 the int8 x of
    its low nibbles' columns as one int32 (column c + j in byte j), 1 of its high ones', 2 its
    eight rounded x's sum, sx * sum(q), as fp32 bits; plane 3's first K // GROUP entries the
    groups' sx, as fp32 bits. The kernels that write x for an INT4 Linear (:func:`add_rms_norm`,
    :func:`silu_mul`) call this too, so their planes are these, bit for bit."""
    WPG: tl.constexpr = GROUP // 8
    G: tl.constexpr = BLOCK // GROUP
    xg = tl.reshape(y, (G, GROUP))
    sx = tl.maximum(tl.max(tl.abs(xg), axis=1), 1e-30) / 127.0  # [G]
    q = tl.floor(tl.div_rn(xg, sx[:, None]) + 0.5)  # [G, GROUP]: -127..127 (IEEE division)
    gi = c0 // GROUP + tl.arange(0, G)
    tl.store(p_ptr + 3 * XS + gi, sx.to(tl.int32, bitcast=True), mask=gi < K // GROUP)
    # [g, half, word, column of four]: column c + j of a half goes to byte j of its word
    q4 = tl.reshape(q.to(tl.int32), (G, 2, WPG, 4))
    shift = (tl.arange(0, 4) * 8)[None, None, None, :]
    packed = tl.sum((q4 & 0xFF) << shift, axis=3)  # [G, 2, WPG]: the bytes do not overlap
    lo, hi = tl.split(tl.permute(packed, (0, 2, 1)))  # [G, WPG] each
    wsum = tl.sum(tl.sum(tl.reshape(q, (G, 2, WPG, 4)), axis=3), axis=1) * sx[:, None]
    wi = gi[:, None] * WPG + tl.arange(0, WPG)[None, :]
    wm = wi < K // 8
    tl.store(p_ptr + wi, lo, mask=wm)
    tl.store(p_ptr + XS + wi, hi, mask=wm)
    tl.store(p_ptr + 2 * XS + wi, wsum.to(tl.int32, bitcast=True), mask=wm)


@triton.jit
def _dp4a(a, b, c, EMULATE: tl.constexpr):
    """c + the sum of a's four bytes (unsigned) times b's (signed), each of a, b int32 (c: int32,
    or None for 0): ``dp4a.u32.s32``, one instruction (EMULATE: by shifts, for Triton's
    interpreter)."""
    if EMULATE:
        out = tl.zeros_like(a) if c is None else c
        for j in tl.static_range(4):
            out += ((a >> (8 * j)) & 0xFF) * ((b << (24 - 8 * j)) >> 24)
    elif c is None:  # (a literal 0: no register zeroed a step)
        out = tl.inline_asm_elementwise(
            "dp4a.u32.s32 $0, $1, $2, 0;", "=r,r,r", [a, b], dtype=tl.int32, is_pure=True,
            pack=1,
        )  # fmt: skip
    else:
        out = tl.inline_asm_elementwise(
            "dp4a.u32.s32 $0, $1, $2, $3;", "=r,r,r,r", [a, b, c], dtype=tl.int32,
            is_pure=True, pack=1,
        )  # fmt: skip
    return out


def int4_a8_planes(x2: torch.Tensor, group: int, pdl: bool = False) -> torch.Tensor:
    """One row x2 [1, K] rounded to int8 by groups of ``group`` and laid out for
    :func:`int4_gemv_a8`: planes [4, K // 8] int32 (:func:`_int4_a8_planes_put`; plane 3's
    first K // group entries the groups' scales as fp32 bits). ``pdl``: as
    :func:`add_rms_norm`'s."""
    k = x2.shape[1]
    planes = torch.empty(4, k // 8, dtype=torch.int32, device=x2.device)
    block = max(group, INT4_PLANES_BLOCK)
    _int4_a8_planes_kernel[(triton.cdiv(k, block),)](
        x2, planes, k, k // 8, GROUP=group, BLOCK=block, PDL=pdl, launch_pdl=pdl
    )
    return planes


def int4_gemv_a8(
    x2: torch.Tensor,
    w: torch.Tensor,
    scale: torch.Tensor,
    low: torch.Tensor,
    bias: torch.Tensor | None,
    count: torch.Tensor | None = None,
    blocks: tuple[int, ...] | None = None,
    pdl: bool = False,
    planes: torch.Tensor | None = None,
) -> torch.Tensor:
    """One row x2 [1, K] times packed INT4 weights (:func:`int4_linear`'s operands) -> [1, N]
    in x2's dtype, x rounded to int8 in the weights' groups first (W4A8:
    :func:`int4_a8_planes`, then :func:`_int4_gemv_kernel` with ``A8``, two launches chained by
    PDL with ``pdl``): each code's product an exact integer, by ``dp4a``. The activations are
    rounded (not exact to :func:`int4_gemv`); an Int4Linear with ``a8`` serves it
    (``llm.int4_activations: int8``). ``blocks``, ``count``: as :func:`int4_gemv`'s;
    ``planes``: x laid out already (:func:`int4_a8_planes`' values, written by the kernel that
    wrote x), so that no launch lays it out here."""
    return int4_gemv(x2, w, scale, low, bias, count, blocks, pdl, planes, a8=True)


def int4_gemv(
    x2: torch.Tensor,
    w: torch.Tensor,
    scale: torch.Tensor,
    low: torch.Tensor,
    bias: torch.Tensor | None,
    count: torch.Tensor | None = None,
    blocks: tuple[int, ...] | None = None,
    pdl: bool = False,
    planes: torch.Tensor | None = None,
    a8: bool = False,
) -> torch.Tensor:
    """One row x2 [1, K] times packed INT4 weights (:func:`int4_linear`'s operands) -> [1, N] in
    x2's dtype (2 to :data:`INT4_GEMV_MAX_ROWS` rows: :func:`_int4_gemv_rows`), on the CUDA
    cores: :func:`_int4_planes_kernel` lays x out for the words, then
    :func:`_int4_gemv_kernel` streams them (two launches, chained by PDL with ``pdl``): the
    GROUPS path's sums without the MMA's padding of one row to 16. ``blocks``: (BLOCK_N, words
    a row a K step, num_warps[, SPLIT]) (None: :data:`INT4_GEMV_TILE`); SPLIT 0 or absent: K is
    split until there are :data:`FP8_PROGRAMS` programs. ``count``: as :func:`int4_linear`'s.
    ``planes``: x already laid out (:func:`int4_planes`'s values, written by the kernel that
    wrote x: :func:`add_rms_norm`, :func:`silu_mul`), so that no launch lays it out here.
    ``a8`` (one row): :func:`int4_gemv_a8` instead, x rounded to int8 by group (``planes``:
    its own). The groups must be at least 8 columns, a power of two."""
    m, k = x2.shape
    n, group = w.shape[0], k // scale.shape[1]
    assert 1 <= m <= INT4_GEMV_MAX_ROWS and x2.stride(-1) == 1 and w.is_contiguous(), x2.shape
    assert group >= 8 and group & (group - 1) == 0, group
    if m > 1:
        assert planes is None and not a8, "one row only: planes, a8"
        return _int4_gemv_rows(x2, w, scale, low, bias, count, blocks, pdl, group)
    bn, bg, warps, tiles, out, k_per_split, split, part, count = _int4_gemv_tiles(
        x2, n, group, blocks, count
    )
    if planes is None:
        planes = int4_a8_planes(x2, group, pdl) if a8 else int4_planes(x2, group, pdl)
    want = (4, k // 8, torch.int32) if a8 else (10, k // 8, torch.float32)
    assert (*planes.shape, planes.dtype) == want and planes.is_contiguous(), planes.shape
    even = n % bn == 0 and k % (bg * group) == 0
    _int4_gemv_kernel[(tiles, 1, split)](
        planes,
        w.view(torch.int32),
        scale,
        low,
        w if bias is None else bias,
        out,
        part,
        w if count is None else count,
        n,
        k,
        k_per_split,
        0x3F800000,
        HAS_BIAS=bias is not None,
        SPLIT=split,
        BLOCK_N=bn,
        BLOCK_G=bg,
        GROUP=group,
        EVEN=even,
        UNROLL=2 if tiles * split <= INT4_GEMV_UNROLL_TILES else 1,
        A8=a8,
        EMULATE=x2.device.type != "cuda",
        PDL=pdl,
        num_warps=warps,
        num_stages=1,
        launch_pdl=pdl,
    )
    return out


def _int4_gemv_rows(
    x2: torch.Tensor,
    w: torch.Tensor,
    scale: torch.Tensor,
    low: torch.Tensor,
    bias: torch.Tensor | None,
    count: torch.Tensor | None,
    blocks: tuple[int, ...] | None,
    pdl: bool,
    group: int,
) -> torch.Tensor:
    """:func:`int4_gemv` for 2 to :data:`INT4_GEMV_MAX_ROWS` rows (:func:`_int4_gemv_rows_kernel`;
    whole steps only: :func:`int4_gemv_fits`)."""
    m, k = x2.shape
    n, rows = w.shape[0], _pow2(m)
    bn, bg, warps, tiles, out, k_per_split, split, part, count = _int4_gemv_tiles(
        x2, n, group, blocks, count
    )
    assert n % bn == 0 and k % (bg * group) == 0, (n, k, bn, bg * group)
    planes = int4_planes(x2, group, pdl, rows)
    _int4_gemv_rows_kernel[(tiles, 1, split)](
        planes,
        w.view(torch.int32),
        scale,
        low,
        w if bias is None else bias,
        out,
        part,
        w if count is None else count,
        m,
        n,
        k,
        k_per_split,
        0x3F800000,
        HAS_BIAS=bias is not None,
        SPLIT=split,
        ROWS=rows,
        BLOCK_N=bn,
        BLOCK_G=bg,
        GROUP=group,
        PDL=pdl,
        num_warps=warps,
        num_stages=1,
        launch_pdl=pdl,
    )
    return out


def _int4_gemv_tiles(
    x2: torch.Tensor,
    n: int,
    group: int,
    blocks: tuple[int, ...] | None,
    count: torch.Tensor | None,
) -> tuple:
    """For :func:`int4_gemv`'s kernels on x2 [m, K] and N outputs: (BLOCK_N, groups a K step,
    num_warps, output tiles, out [m, N], columns a split, splits, the splits' partial sums,
    counters). ``blocks``: as :func:`int4_gemv`'s (None: :func:`int4_gemv_tile`)."""
    m, k = x2.shape
    bn, words, warps = (blocks or int4_gemv_tile(m))[:3]
    split = blocks[3] if blocks and len(blocks) > 3 else 0
    bg = _int4_step_groups(words, group)
    tiles = triton.cdiv(n, bn)
    if not split:
        split = _split_rule(tiles, k, max(FP8_MIN_SPLIT_K, bg * group))
    out = torch.empty(m, n, dtype=x2.dtype, device=x2.device)
    k_per_split, split, part, count = _split_k(out, k, split, bg * group, tiles, count)
    return bn, bg, warps, tiles, out, k_per_split, split, part, count


def _int4_step_groups(words: int, group: int) -> int:
    """Groups a K step of ``words`` packed words a row (at least one)."""
    return max(1, words // (group // 8))


def int4_gemv_tile(m: int) -> tuple[int, int, int]:
    """:func:`int4_gemv`'s default (BLOCK_N, words a row a K step, num_warps) for ``m`` rows:
    :data:`INT4_GEMV_TILE` at one and two, one weight row a program above (registers: 96 at
    two rows of each, 114 at four x one, 168 at four x two; sm_90)."""
    bn, words, warps = INT4_GEMV_TILE
    return (bn if m <= 2 else 1), words, warps


def int4_gemv_fits(m: int, n: int, k: int, group: int) -> bool:
    """Whether :func:`int4_gemv` takes x [m, k] against weights [n, k] in groups of ``group``:
    one row always (groups of a power of two, at least 8 columns); 2 to
    :data:`INT4_GEMV_MAX_ROWS` rows where its default tile's steps are whole."""
    if group < 8 or group & (group - 1) or not 1 <= m <= INT4_GEMV_MAX_ROWS:
        return False
    bn, words, _ = int4_gemv_tile(m)
    return m == 1 or (n % bn == 0 and k % (_int4_step_groups(words, group) * group) == 0)


MAGIC_BITS = {torch.bfloat16: 1, torch.float16: 2}  # int4_linear's widening by bits, by x dtype
INT4_SCALED_ROWS = 32  # above this many rows, the SCALED path (wide enough weights)
INT4_MANY_ROWS_TILE = (64, 64, 4, 3)  # its tiles: BM, BN, warps, stages
INT4_WIDEN_ROWS = 160  # above this many, WIDEN (faster from ~192 rows on Llama-8B's shapes)
INT4_SCALED_MIN_WIDTH = 4096  # N and K both at least this for the SCALED path
INT4_GROUP_ROWS = 64  # narrower weights: GROUPS up to this many rows, then WIDEN
INT4_GEMV_ROWS = 2  # steps of at most this many rows take int4_gemv (0: none; more than one:
# wide weights only, int4_path). Two rows (_int4_gemv_rows_kernel): 8B TPOT 3.88 -> 3.56 ms
# against GROUPS, 1B 0.95 both; four (one weight row a program): 3.91 -> 9.25 ms (H200,
# docs/benchmarks.md 65)
INT4_GEMV_MAX_ROWS = 4  # ... that it takes at most (eight spill registers in groups of 32)
INT4_GEMV_TILE = (2, 128, 1)  # its (BLOCK_N, words a row a K step, num_warps): the best one
# tile on Llama-8B's and -1B's shapes, groups of 128 and 32 (H200, docs/benchmarks.md 64)
INT4_GEMV_UNROLL_TILES = 2048  # its K loop unrolled twice at up to this many programs (about
# a wave): Llama-8B down 18.4 -> 16.4 us, o 8.1 -> 7.8, 1B down 11.3 -> 8.8; more programs
# lost (8B gate_up 26.7 -> 29.9, qkv 9.7 -> 10.8; H200, docs/benchmarks.md 65)
INT4_PLANES_BLOCK = 1024  # columns a program of int4_planes (at least a group)
INT4_PLANES_FUSED = True  # the kernels that write an INT4 Linear's one-row x write its planes
# too (add_rms_norm, silu_mul), one launch less each: 8B TPOT 2.75 -> 2.66 ms, 1B 0.85 -> 0.80
# (H200, docs/benchmarks.md 65)
INT4_GROUP_BYTES = 4096  # GROUPS: the codes a program reads a K step: 64 rows of a group of 128;
# groups of 32 (16 bytes a row) in 64 rows read a quarter of that and ran an 8B step 2x slower


@triton.jit
def _int4_dequant_kernel(
    w_ptr,
    s_ptr,
    l_ptr,
    out_ptr,
    N,
    K,
    GROUP: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PDL: tl.constexpr,
):
    pid_n, g = tl.program_id(0), tl.program_id(1)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    nm = rn < N
    HALF: tl.constexpr = GROUP // 2
    half = tl.arange(0, HALF)
    groups = K // GROUP
    p = tl.load(
        w_ptr + rn[:, None].to(tl.int64) * (K // 2) + (g * HALF + half)[None, :],
        mask=nm[:, None],
        other=0,
    )  # [BN, HALF]
    _pdl_enter(PDL)
    low = tl.load(l_ptr + rn.to(tl.int64) * groups + g, mask=nm, other=0.0)
    low = low.to(tl.float32)[:, None]  # [BN, 1]
    s = tl.load(s_ptr + rn.to(tl.int64) * groups + g, mask=nm, other=0.0).to(tl.float32)[:, None]
    lo = (p & 15).to(tl.float32) * s + low
    hi = (p >> 4).to(tl.float32) * s + low
    at = out_ptr + rn[:, None].to(tl.int64) * K + (g * GROUP + half)[None, :]
    tl.store(at, lo.to(out_ptr.dtype.element_ty), mask=nm[:, None])
    tl.store(at + HALF, hi.to(out_ptr.dtype.element_ty), mask=nm[:, None])


def int4_dequantize(
    w: torch.Tensor, scale: torch.Tensor, low: torch.Tensor, dtype: torch.dtype, pdl: bool = False
) -> torch.Tensor:
    """Packed INT4 weights w [N, K // 2] with scales and lows [N, G] -> [N, K] in ``dtype``:
    code * scale + low in fp32, then in ``dtype`` (:meth:`Int4Linear.dequantized`'s values)."""
    n, k = w.shape[0], 2 * w.shape[1]
    group = k // scale.shape[1]
    out = torch.empty(n, k, dtype=dtype, device=w.device)
    block_n = 32
    _int4_dequant_kernel[(triton.cdiv(n, block_n), k // group)](
        w,
        scale,
        low,
        out,
        n,
        k,
        GROUP=group,
        BLOCK_N=block_n,
        PDL=pdl,
        num_warps=4,
        launch_pdl=pdl,
    )
    return out
