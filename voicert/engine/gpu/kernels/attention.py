"""RoPE and the KV-pool write in one launch (:func:`rope_kv_write`), and attention straight from
the paged pool through the block table (:func:`paged_attention`): tiles of query rows, split
over the keys when the programs are few (flash-decoding), the last split of a tile combining
them.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from voicert.engine.gpu.kernels.common import (
    _pdl_enter,
    _pow2,
    _reset_counter,
    _rotate,
    _to_pool,
    counters,
)

MAX_ATTN_ROWS = (
    64  # query rows (tokens x query heads per KV head) the paged kernel takes per program
)
_SPLIT_TARGET = 128  # aim for about this many attention programs (an H100 has 132 SMs)
_MAX_SPLITS = 16  # key splits per KV head at most (the combine reads them all in one load)
# When a row's query rows (tokens x query heads per KV head) pass 16 (prefill, long verify rows):
# the largest tile of 64, 32 or 16 query rows that still gives _TILE_PROGRAMS programs (fewer
# rows: more programs on a short prompt); _PREFILL_ROWS, when set, fixes it
# (scripts/gpu/prefill_tiles.py sweeps both settings). A merge of a tile's splits reads at most
# _TILE_SPLIT_FLOATS partial floats (SPLITS x ROWS x D in one load: past ~32 KB it spills
# registers). Measured: docs/benchmarks.md section 30.
_TILE_PROGRAMS = 48
_PREFILL_ROWS = 0
_TILE_SPLIT_FLOATS = 8192
_TILE_BLOCK_N = 0  # keys per inner step of a program of more than 16 rows; 0: 8192 // head dim,
# 16 to 128
_DECODE_BLOCK_N = 0  # keys per inner step of a program of 16 rows or fewer; 0: 64 up to a head
# dim of 64, 128 at 128 (1.0-1.5x faster than 32 there, section 30), else 32
_DECODE_STAGES = 0  # software-pipeline stages of such a program's key loop; 0: Triton's default,
# 3 (compiled for sm_90 at head dim 128 and 128 keys a step: 222 registers, two programs an SM;
# 2 stages: 167; 64 keys, 2 stages: 122, four an SM; bench.attention's triton@KEYS:STAGES)
_DECODE_WARPS = 0  # warps of such a program; 0: 4 (8 warps at 128 keys: 128 registers with 3
# stages, 80 with 2; docs/benchmarks.md 71)
ROPE_IN_ATTENTION_ROWS = 8  # decode and verify steps of at least this many rows (sequences x
# new tokens) do their RoPE and KV write inside the paged attention (each program rotates its q
# rows; the one whose key split holds a new key writes it), not in a launch of rope_kv_write
# before it; 0: never. GPU time a step, inside against before (H200, docs/benchmarks.md 73-74):
# from 8 rows it gains 0.9-2.5 % (1B bf16, 8B bf16, FP8, INT4; +0.4 % once, INT4 at 16); below
# 8, INT4 loses (+4.4 / +1.6 / +2.1 % at 1 / 2 / 4 rows), 8B bf16 at 1 (+2.7 %) and 1B bf16
# at 1 (+0.9 %), while bf16 and FP8 gain ~1 % at 2-4.


# ----------------------------------------------------------------------------- RoPE + KV write


@triton.jit
def _rope_kv_kernel(
    qkv_ptr,
    pos_ptr,
    cos_ptr,
    sin_ptr,
    slot_ptr,
    k_ptr,
    v_ptr,
    qn_ptr,
    kn_ptr,
    eps,
    n_rot,
    kvh_n,
    n_q_heads,
    n_pos,
    D: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_KV: tl.constexpr,
    KV_FP8: tl.constexpr,
    KV_INT8: tl.constexpr,
    QK_NORM: tl.constexpr,
    ROW: tl.constexpr,
    PDL: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    HALF: tl.constexpr = D // 2
    d = tl.arange(0, HALF)
    # Before the PDL wait: the position, its slot and its row of the tables, which the kernel
    # before (the qkv Linear) does not write, so that their reads overlap it.
    p = tl.minimum(tl.load(pos_ptr + t), n_pos - 1)  # the tables' row for this position
    c = tl.load(cos_ptr + p * HALF + d).to(tl.float32)[None, :]
    sn = tl.load(sin_ptr + p * HALF + d).to(tl.float32)[None, :]
    slot = tl.load(slot_ptr + t).to(tl.int64)
    _pdl_enter(PDL)
    row = qkv_ptr + t * (n_rot + kvh_n) * D  # this token's [H + 2 KVH, D]
    heads = tl.arange(0, BLOCK_H)
    hm = (heads < n_rot)[:, None]
    lo = row + heads[:, None] * D + d[None, :]
    x1 = tl.load(lo, mask=hm, other=0.0).to(tl.float32)
    x2 = tl.load(lo + HALF, mask=hm, other=0.0).to(tl.float32)
    if QK_NORM:  # Qwen3: each q and k head RMS-normalised over D, then RoPE
        is_q = (heads < n_q_heads)[:, None]
        x1, x2 = _head_rms_norm(x1, x2, is_q, qn_ptr, kn_ptr, d, eps, D, qkv_ptr.dtype.element_ty)
    o1, o2 = _rotate(x1, x2, c, sn, qkv_ptr.dtype.element_ty)
    tl.store(lo, o1, mask=hm)  # q and k rotated in place
    tl.store(lo + HALF, o2, mask=hm)
    kh = heads - n_q_heads  # rows n_q_heads.. of the rotated block are k heads
    km = (heads >= n_q_heads) & (heads < n_rot)
    _pool_put_halves(k_ptr, (slot * kvh_n + kh) * ROW, d, o1, o2, km, D, KV_FP8, KV_INT8)
    vh = tl.arange(0, BLOCK_KV)
    dd = tl.arange(0, D)
    vm = vh < kvh_n
    v = tl.load(row + (n_rot + vh)[:, None] * D + dd[None, :], mask=vm[:, None], other=0.0)
    _pool_put(v_ptr, (slot * kvh_n + vh) * ROW, dd, v, vm, D, KV_FP8, KV_INT8)


@triton.jit
def _pool_put_halves(
    pool_ptr, rows, d, x1, x2, m, D: tl.constexpr, KV_FP8: tl.constexpr, KV_INT8: tl.constexpr
):
    """Rows [N, D] given as halves x1, x2 [N, D/2] written at the pool row offsets ``rows``
    [N] where ``m``: in the pool's dtype (FP8 clamped to e4m3's range), or int8 scaled by each
    row's largest magnitude / 127 with that float32 scale stored after the row."""
    HALF: tl.constexpr = D // 2
    dst = pool_ptr + rows[:, None] + d[None, :]
    if KV_INT8:
        f1, f2 = x1.to(tl.float32), x2.to(tl.float32)
        amax = tl.maximum(tl.max(tl.abs(f1), axis=1), tl.max(tl.abs(f2), axis=1))
        sc = _int8_row_scale(pool_ptr, rows, amax, m, D)
        tl.store(dst, _int8(f1 / sc[:, None]), mask=m[:, None])
        tl.store(dst + HALF, _int8(f2 / sc[:, None]), mask=m[:, None])
    else:
        tl.store(dst, _to_pool(x1, pool_ptr, KV_FP8), mask=m[:, None])
        tl.store(dst + HALF, _to_pool(x2, pool_ptr, KV_FP8), mask=m[:, None])


@triton.jit
def _pool_put(
    pool_ptr, rows, dd, x, m, D: tl.constexpr, KV_FP8: tl.constexpr, KV_INT8: tl.constexpr
):
    """Rows x [N, D] written as :func:`_pool_put_halves` writes them."""
    dst = pool_ptr + rows[:, None] + dd[None, :]
    if KV_INT8:
        f = x.to(tl.float32)
        sc = _int8_row_scale(pool_ptr, rows, tl.max(tl.abs(f), axis=1), m, D)
        tl.store(dst, _int8(f / sc[:, None]), mask=m[:, None])
    else:
        tl.store(dst, _to_pool(x, pool_ptr, KV_FP8), mask=m[:, None])


@triton.jit
def _head_rms_norm(x1, x2, is_q, qn_ptr, kn_ptr, d, eps, D: tl.constexpr, dtype: tl.constexpr):
    """Each head's row [BLOCK_H, D] (given as its halves x1, x2, float32) normalised over D and
    scaled by the q weights [D] (rows where ``is_q``) or the k weights, rounded to ``dtype`` as
    layers.RMSNorm rounds on the CPU (normalised in float32, cast, times the weight, cast)."""
    HALF: tl.constexpr = D // 2
    rstd = 1.0 / tl.sqrt((tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)) / D + eps)
    w1 = tl.where(is_q, tl.load(qn_ptr + d)[None, :], tl.load(kn_ptr + d)[None, :])
    w2 = tl.where(is_q, tl.load(qn_ptr + HALF + d)[None, :], tl.load(kn_ptr + HALF + d)[None, :])
    y1 = (x1 * rstd[:, None]).to(dtype).to(tl.float32) * w1.to(tl.float32)
    y2 = (x2 * rstd[:, None]).to(dtype).to(tl.float32) * w2.to(tl.float32)
    return y1.to(dtype).to(tl.float32), y2.to(dtype).to(tl.float32)


@triton.jit
def _int8_row_scale(pool_ptr, rows, amax, m, D: tl.constexpr):
    """An int8 pool's scale for rows whose largest magnitudes are ``amax`` [N] (amax / 127, at
    least 1e-12), stored as float32 after each row's D values where ``m``; returns it [N]."""
    sc = tl.maximum(amax / 127, 1e-12)
    tl.store((pool_ptr + rows + D).to(tl.pointer_type(tl.float32)), sc, mask=m)
    return sc


@triton.jit
def _int8(x):
    """Round half to even and saturate to [-127, 127], as torch.round and clamp do."""
    return tl.clamp(libdevice.rint(x), -127.0, 127.0).to(tl.int8)


def rope_kv_write(
    qkv: torch.Tensor,
    positions: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    slots: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    pdl: bool = False,
    qk_norm: tuple[torch.Tensor, torch.Tensor, float] | None = None,
) -> None:
    """qkv [T, (H + 2 KVH) * D] contiguous; positions [T] int64; cos/sin [P, D/2], the model's
    tables of cos and sin of each position's angles (positions past P - 1 read row P - 1: the
    caller keeps positions below P); slots [T] int64; k_pool/v_pool [NB, BS, KVH, D] (one
    layer's, contiguous; qkv's dtype, or llm.kv_cache's float8_e4m3fn, or int8 with each row's
    float32 scale after it: row D + 4, models/layers.py). Rotates q and k in place in
    ``qkv`` (HF's half-split RoPE) and writes each token's k and v into its slot. ``pdl``: as
    :func:`add_rms_norm`'s. ``qk_norm`` (Qwen3): the q and k RMSNorm weights [D] and eps; each
    q and k head is normalised over D before it is rotated (and stored so in ``qkv``)."""
    n_rot = num_heads + num_kv_heads
    d = qkv.shape[-1] // (n_rot + num_kv_heads)
    q_w, k_w, eps = qk_norm if qk_norm is not None else (cos, cos, 0.0)
    _rope_kv_kernel[(qkv.shape[0],)](
        qkv,
        positions,
        cos,
        sin,
        slots,
        k_pool,
        v_pool,
        q_w,
        k_w,
        eps,
        n_rot,
        num_kv_heads,
        num_heads,
        cos.shape[0],
        D=d,
        BLOCK_H=_pow2(n_rot),
        BLOCK_KV=_pow2(num_kv_heads),
        KV_FP8=k_pool.dtype == torch.float8_e4m3fn,
        KV_INT8=k_pool.dtype == torch.int8,
        QK_NORM=qk_norm is not None,
        ROW=k_pool.shape[-1],
        PDL=pdl,
        num_warps=4,
        launch_pdl=pdl,
    )


# ----------------------------------------------------------------------------- paged attention


@triton.jit
def _combine(
    part_ptr,
    ml_ptr,
    base,
    active,
    valid,
    r,
    d,
    SPLITS: tl.constexpr,
    D: tl.constexpr,
    ROWS: tl.constexpr,
):
    """The ``active`` splits' partial results of one (sequence, KV head) merged, for the
    ``valid`` query rows: [ROWS, D] float32. Loads from L2 (``.cg``): the other programs' stores
    are not in this program's L1. Split by split, unrolled: every load is issued at once and
    each thread adds up its own elements, where a sum over a [SPLITS, ROWS, D] tile's split axis
    takes shuffles across lanes and barriers. Against that form, at 1B's decode shape (sm_90)
    the merging code went from 1,342 instructions (145 shuffles) to 795 (1), the kernel from
    166 registers to 118 (8B: 88 bytes of stack to 48), and the 1B bf16 step from 0.883 to
    0.860 ms (H200, docs/benchmarks.md 76)."""
    rows = base * ROWS + r  # [ROWS] each query row's index in split 0's results
    top = tl.full([ROWS], -1.0e30, tl.float32)
    for sp in tl.static_range(SPLITS):  # the largest running max of each row
        sm = valid & (sp < active)
        m = tl.load(ml_ptr + (rows + sp * ROWS) * 2, mask=sm, other=-1.0e30, cache_modifier=".cg")
        top = tl.maximum(top, m)
    l_all = tl.zeros([ROWS], tl.float32)
    acc = tl.zeros([ROWS, D], tl.float32)
    for sp in tl.static_range(SPLITS):  # each split's share, weighted by exp(its max - top)
        sm = valid & (sp < active)
        at = rows + sp * ROWS  # [ROWS]
        # (the max read again: the compiler keeps the first pass's read, 16 + 16 scalar loads)
        m = tl.load(ml_ptr + at * 2, mask=sm, other=-1.0e30, cache_modifier=".cg")
        l_s = tl.load(ml_ptr + at * 2 + 1, mask=sm, other=0.0, cache_modifier=".cg")
        p = tl.load(
            part_ptr + at[:, None] * D + d[None, :],
            mask=sm[:, None],
            other=0.0,
            cache_modifier=".cg",
        )  # [ROWS, D]
        w = tl.exp(m - top)  # [ROWS]; 0 where the split holds no keys
        l_all += w * l_s
        acc += w[:, None] * p
    return acc / tl.maximum(l_all, 1.0e-30)[:, None]


@triton.jit
def _kv_rows(table_ptr, table_row, keys, km, kvh, kvh_n, BS: tl.constexpr, ROW: tl.constexpr):
    """[BLOCK_N] each key's pool row offset (for KV head ``kvh``), through the block table."""
    page = tl.load(table_ptr + table_row + keys // BS, mask=km, other=0).to(tl.int64)
    return ((page * BS + keys % BS) * kvh_n + kvh) * ROW


@triton.jit
def _kv_tile(pool_ptr, kv_row, d, km, D: tl.constexpr, KV_INT8: tl.constexpr):
    """[BLOCK_N, D] the keys' (or values') rows where ``km`` (else 0): in the pool's dtype, or
    an int8 pool's widened to float32 by each row's scale, stored after it."""
    x = tl.load(pool_ptr + kv_row[:, None] + d[None, :], mask=km[:, None], other=0.0)
    if KV_INT8:
        sc = tl.load((pool_ptr + kv_row + D).to(tl.pointer_type(tl.float32)), mask=km, other=0.0)
        x = x.to(tl.float32) * sc[:, None]
    return x


@triton.jit
def _attn_step(q, k, v, keys, km, pos, m_i, l_i, acc, scale, IEEE: tl.constexpr):
    """One tile of keys k [BLOCK_N, D] and values v (q's dtype) into the online softmax of the
    query rows q [ROWS, D]: the running max m_i [ROWS], sum l_i and output acc [ROWS, D]."""
    if IEEE:
        sc = tl.dot(q, tl.trans(k), input_precision="ieee")
    else:
        sc = tl.dot(q, tl.trans(k))
    sc = sc * scale
    sc = tl.where((keys[None, :] <= pos[:, None]) & km[None, :], sc, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(sc, axis=1))
    alpha = tl.exp(m_i - m_new)
    p = tl.exp(sc - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    if IEEE:
        acc = acc * alpha[:, None] + tl.dot(p, v.to(tl.float32), input_precision="ieee")
    else:
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return m_new, l_i, acc


@triton.jit
def _rope_rows(cos_ptr, sin_ptr, pos, n_pos, D: tl.constexpr):
    """cos and sin [N, D/2] (float32) of the positions ``pos`` [N], each clamped into the
    tables' n_pos rows (a masked row's -1 reads row 0)."""
    HALF: tl.constexpr = D // 2
    hd = tl.arange(0, HALF)
    at = tl.minimum(tl.maximum(pos, 0), n_pos - 1)[:, None] * HALF + hd[None, :]
    return tl.load(cos_ptr + at).to(tl.float32), tl.load(sin_ptr + at).to(tl.float32)


@triton.jit
def _rope_q(
    q_rows, valid, c, sn, qn_ptr, kn_ptr, eps, ROWS: tl.constexpr, D: tl.constexpr,
    QK_NORM: tl.constexpr, dtype: tl.constexpr,
):  # fmt: skip
    """The query rows at ``q_rows`` [ROWS, 1] (where ``valid``) rotated by c, sn [ROWS, D/2]
    (normalised first with QK_NORM), as rope_kv_write stores them: [ROWS, D] in ``dtype``."""
    HALF: tl.constexpr = D // 2
    hd = tl.arange(0, HALF)[None, :]
    x1 = tl.load(q_rows + hd, mask=valid[:, None], other=0.0).to(tl.float32)
    x2 = tl.load(q_rows + HALF + hd, mask=valid[:, None], other=0.0).to(tl.float32)
    if QK_NORM:
        is_q = (tl.arange(0, ROWS) >= 0)[:, None]
        x1, x2 = _head_rms_norm(x1, x2, is_q, qn_ptr, kn_ptr, tl.arange(0, HALF), eps, D, dtype)
    o1, o2 = _rotate(x1, x2, c, sn, dtype)
    return tl.reshape(tl.permute(tl.join(o1, o2), (0, 2, 1)), (ROWS, D))  # halves side by side


@triton.jit
def _put_new_keys(
    k_src, v_src, own, c, sn, k_ptr, v_ptr, rows, qn_ptr, kn_ptr, eps, D: tl.constexpr,
    KV_FP8: tl.constexpr, KV_INT8: tl.constexpr, QK_NORM: tl.constexpr, dtype: tl.constexpr,
):  # fmt: skip
    """The new keys at ``k_src`` [N, 1] where ``own`` rotated by c, sn [N, D/2] (normalised
    first with QK_NORM) and written with their values (``v_src``) at the pool rows ``rows``
    [N], as rope_kv_write writes them."""
    HALF: tl.constexpr = D // 2
    hd = tl.arange(0, HALF)
    k1 = tl.load(k_src + hd[None, :], mask=own[:, None], other=0.0).to(tl.float32)
    k2 = tl.load(k_src + HALF + hd[None, :], mask=own[:, None], other=0.0).to(tl.float32)
    if QK_NORM:
        is_q = (rows < 0)[:, None]  # (none: these are keys)
        k1, k2 = _head_rms_norm(k1, k2, is_q, qn_ptr, kn_ptr, hd, eps, D, dtype)
    n1, n2 = _rotate(k1, k2, c, sn, dtype)
    _pool_put_halves(k_ptr, rows, hd, n1, n2, own, D, KV_FP8, KV_INT8)
    dd = tl.arange(0, D)
    v = tl.load(v_src + dd[None, :], mask=own[:, None], other=0.0)
    _pool_put(v_ptr, rows, dd, v, own, D, KV_FP8, KV_INT8)


@triton.jit
def _paged_attn_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    table_ptr,
    pos_ptr,
    out_ptr,
    part_ptr,
    ml_ptr,
    count_ptr,
    cos_ptr,
    sin_ptr,
    slot_ptr,
    qn_ptr,
    kn_ptr,
    eps,
    n_pos,
    q_len,
    n_q_heads,
    kvh_n,
    q_stride,
    max_blocks,
    split_keys,
    n_splits,
    tiles,
    scale,
    G: tl.constexpr,
    D: tl.constexpr,
    BS: tl.constexpr,
    ROWS: tl.constexpr,
    TILE: tl.constexpr,
    TOKENS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SPLITS: tl.constexpr,
    IEEE: tl.constexpr,
    KV_FP8: tl.constexpr,
    KV_INT8: tl.constexpr,
    ROW: tl.constexpr,
    ROPE: tl.constexpr,
    QK_NORM: tl.constexpr,
    PDL: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    kvh = tl.program_id(1)
    t = tl.program_id(2) // n_splits  # this program's tile of TILE query tokens
    s = tl.program_id(2) % n_splits  # and its split of the key axis
    r = tl.arange(0, ROWS)  # query rows: token t * TILE + r // G, query head kvh * G + r % G
    qi = t * TILE + r // G
    head = kvh * G + r % G
    valid = (r // G < TILE) & (qi < q_len)
    d = tl.arange(0, D)
    # The positions before the PDL wait: the kernel before (rope_kv_write: q rotated in place,
    # this step's keys and values in their slots) does not write them, so their read overlaps it.
    pos = tl.load(pos_ptr + b * q_len + qi, mask=valid, other=-1)  # last key each row may see
    last = tl.max(pos, axis=0)
    start = s * split_keys
    end = tl.minimum(start + split_keys, last + 1)
    dtype = q_ptr.dtype.element_ty
    if ROPE:  # (before the wait too: the tables' rows, this tile's new tokens and slots)
        qc, qs = _rope_rows(cos_ptr, sin_ptr, pos, n_pos, D)  # [ROWS, D/2] each
        tj = t * TILE + tl.arange(0, TOKENS)  # the tile's tokens (TILE of them): their keys are new
        tok = (tj < t * TILE + TILE) & (tj < q_len)
        tpos = tl.load(pos_ptr + b * q_len + tj, mask=tok, other=-1)
        own = tok & (tpos >= start) & (tpos < start + split_keys)  # in this split: written here
        tslot = tl.load(slot_ptr + b * q_len + tj, mask=own, other=0).to(tl.int64)
        kc, ks = _rope_rows(cos_ptr, sin_ptr, tpos, n_pos, D)  # [TOKENS, D/2] each
    # The first key tile's pool rows before the wait too: no kernel of the step writes the block
    # table, so one dependent read leaves the chain that starts at the wait.
    first = start + tl.arange(0, BLOCK_N)
    kv_first = _kv_rows(table_ptr, b * max_blocks, first, first < end, kvh, kvh_n, BS, ROW)
    _pdl_enter(PDL)
    if ROPE:  # q rotated here; this split's new keys rotated and written, as rope_kv_write does
        q_rows = q_ptr + (b * q_len + qi)[:, None] * q_stride + head[:, None] * D  # [ROWS, 1]
        q = _rope_q(q_rows, valid, qc, qs, qn_ptr, kn_ptr, eps, ROWS, D, QK_NORM, dtype)
        t_rows = q_ptr + (b * q_len + tj)[:, None] * q_stride  # [TOKENS, 1] the tokens' qkv
        k_src, v_src = t_rows + (n_q_heads + kvh) * D, t_rows + (n_q_heads + kvh_n + kvh) * D
        rows = (tslot * kvh_n + kvh) * ROW  # [TOKENS] the new keys' pool rows
        _put_new_keys(k_src, v_src, own, kc, ks, k_ptr, v_ptr, rows, qn_ptr, kn_ptr, eps, D,
                      KV_FP8, KV_INT8, QK_NORM, dtype)  # fmt: skip
        tl.debug_barrier()  # the new rows stored before any thread reads its keys below
    else:
        q = tl.load(
            q_ptr + (b * q_len + qi)[:, None] * q_stride + head[:, None] * D + d[None, :],
            mask=valid[:, None],
            other=0.0,
        )  # [ROWS, D]
    m_i = tl.full([ROWS], -1.0e30, tl.float32)
    l_i = tl.zeros([ROWS], tl.float32)
    acc = tl.zeros([ROWS, D], tl.float32)
    for n0 in range(start, end, BLOCK_N):
        keys = n0 + tl.arange(0, BLOCK_N)
        km = keys < end
        # (the rows read here for each later tile: carried from one step to the next instead,
        # they let Triton's pipeliner double-buffer K and V, over sm_90's shared memory at fp32)
        kv_row = _kv_rows(table_ptr, b * max_blocks, keys, km & (n0 != start), kvh, kvh_n, BS, ROW)
        kv_row = tl.where(n0 == start, kv_first, kv_row)
        k = _kv_tile(k_ptr, kv_row, d, km, D, KV_INT8).to(q.dtype)  # [BLOCK_N, D]
        v = _kv_tile(v_ptr, kv_row, d, km, D, KV_INT8).to(q.dtype)  # (a one-byte pool widened)
        m_i, l_i, acc = _attn_step(q, k, v, keys, km, pos, m_i, l_i, acc, scale, IEEE)
    dst = out_ptr + ((b * q_len + qi) * n_q_heads + head)[:, None] * D + d[None, :]
    if SPLITS == 1:
        o = acc / tl.maximum(l_i, 1.0e-30)[:, None]
        tl.store(dst, o.to(out_ptr.dtype.element_ty), mask=valid[:, None])
    else:  # partial results to scratch; the last of this (b, kvh, t)'s programs merges them
        tile = (b * kvh_n + kvh) * tiles + t
        base = tile * n_splits
        active = tl.cdiv(last + 1, split_keys)  # splits holding keys; the rest have nothing
        if s < active:
            keep = valid[:, None]  # padded query rows are never read
            tl.store(part_ptr + ((base + s) * ROWS + r)[:, None] * D + d[None, :], acc, mask=keep)
            tl.store(ml_ptr + ((base + s) * ROWS + r) * 2, m_i, mask=valid)
            tl.store(ml_ptr + ((base + s) * ROWS + r) * 2 + 1, l_i, mask=valid)
        tl.debug_barrier()  # every thread's stores issued before the release below
        count = count_ptr + tile
        if tl.atomic_add(count, 1, sem="acq_rel") == n_splits - 1:
            o = _combine(part_ptr, ml_ptr, base, active, valid, r, d, SPLITS, D, ROWS)
            tl.store(dst, o.to(out_ptr.dtype.element_ty), mask=valid[:, None])
            _reset_counter(count)  # ready for the next launch


def _prefill_rows(heads: int, q_len: int, g: int) -> int:
    """Query rows per program for rows of ``q_len`` tokens over ``heads`` (sequence, KV head)
    pairs with ``g`` query heads each (see _TILE_PROGRAMS)."""
    if _PREFILL_ROWS:
        return max(_PREFILL_ROWS, _pow2(g))
    for rows in (64, 32, 16):
        if rows < g or heads * triton.cdiv(q_len, rows // g) >= _TILE_PROGRAMS:
            return max(rows, _pow2(g))
    return max(16, _pow2(g))


class RopeInputs(NamedTuple):
    """What :func:`rope_kv_write` takes beside qkv, the positions and the pools (see there), for
    :func:`paged_attention` to do that work itself (:func:`rope_in_attention`)."""

    cos: torch.Tensor
    sin: torch.Tensor
    slots: torch.Tensor
    qk_norm: tuple[torch.Tensor, torch.Tensor, float] | None = None


def rope_in_attention(batch: int, q_len: int, group: int) -> bool:
    """Whether a step of ``batch`` sequences of ``q_len`` new tokens, ``group`` query heads per
    KV head, takes its RoPE and KV write inside :func:`paged_attention`: a decode or verify
    step whose tokens fit one program's 16 query rows, of at least
    :data:`ROPE_IN_ATTENTION_ROWS` rows in all (0: none)."""
    rows = ROPE_IN_ATTENTION_ROWS
    return rows > 0 and batch * q_len >= rows and q_len * group <= 16


def paged_attention(
    qkv: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    block_tables: torch.Tensor,
    positions: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    count: torch.Tensor | None = None,
    pdl: bool = False,
    rope: RopeInputs | None = None,
) -> torch.Tensor:
    """Causal attention of Q new tokens per sequence over the paged pool (their own k/v already
    written). qkv [B, Q, (H + 2 KVH) * D] (q heads first, rotated); k_pool/v_pool [NB, BS, KVH, D]
    (qkv's dtype, or llm.kv_cache's float8_e4m3fn or int8 with scales, widened as read);
    block_tables [B, MB] int64; positions [B, Q] int64 (query q sees keys 0..positions[b, q]);
    count: zeroed int32 counters from :func:`counters` (None: fresh ones for this call); ``pdl``:
    as :func:`add_rms_norm`'s. ``rope`` (a step that :func:`rope_in_attention` takes): q and k
    in qkv not yet rotated, this step's keys and values not yet written; the launch does what
    :func:`rope_kv_write` would, bit for bit, except that it leaves qkv as it is. Returns
    [B, Q, H * D].

    A program takes a tile of query tokens of one sequence and the query heads of one KV head
    (16 rows: a decode or verify step's tokens fit one tile; more: :func:`_prefill_rows`' tiles,
    several per prefill row), and one split of the key axis: splits are added while the programs
    are fewer than an H100 has SMs, and the last split of each tile to finish merges them."""
    b, q_len = qkv.shape[:2]
    _nb, bs, kvh, row = k_pool.shape
    d = qkv.shape[-1] // (num_heads + 2 * kvh)
    g = num_heads // num_kv_heads
    rows = max(16, _pow2(q_len * g))  # the step's tokens x the query heads of one KV head
    if rows > 16:  # more query rows than a decode step's: tiles by the prefill rule
        rows = _prefill_rows(b * kvh, q_len, g)
    tile = rows // g  # query tokens per program
    tiles = triton.cdiv(q_len, tile)
    span = block_tables.shape[1] * bs
    if rows > 16:  # prefill tiles: more keys a step (scripts/gpu/prefill_tiles.py keys)
        block_n, warps, stages = _TILE_BLOCK_N or min(128, max(16, 8192 // d)), 4, 3
    else:
        block_n = _DECODE_BLOCK_N or (64 if d <= 64 else 128 if d == 128 else 32)
        warps, stages = _DECODE_WARPS or 4, _DECODE_STAGES or 3
    programs = b * kvh * tiles
    most = _MAX_SPLITS if rows <= 16 else max(1, _TILE_SPLIT_FLOATS // (rows * d))
    splits = max(1, min(triton.cdiv(span, block_n), _SPLIT_TARGET // programs, most))
    split_keys = triton.cdiv(triton.cdiv(span, splits), block_n) * block_n
    splits = triton.cdiv(span, split_keys)
    out = qkv.new_empty(b, q_len, num_heads * d)
    split = splits > 1  # partial results go to scratch; the last program per tile merges them
    part = out.new_empty(programs * splits * rows * d, dtype=torch.float32) if split else out
    ml = out.new_empty(programs * splits * rows * 2, dtype=torch.float32) if split else out
    if count is None:
        count = counters(qkv.device, programs)
    assert count.numel() >= programs or not split, "too few counters for the attention's tiles"
    if rope is not None:  # one program per (row, KV head, key split): it owns its new keys
        assert rows <= 16 and tiles == 1, "RoPE in the attention: decode and verify steps only"
    cos, sin, slots, norms = rope if rope is not None else (qkv, qkv, positions, None)
    q_w, k_w, eps = norms if norms is not None else (qkv, qkv, 0.0)
    _paged_attn_kernel[(b, kvh, tiles * splits)](
        qkv,
        k_pool,
        v_pool,
        block_tables,
        positions,
        out,
        part,
        ml,
        count,
        cos,
        sin,
        slots,
        q_w,
        k_w,
        eps,
        cos.shape[0],
        q_len,
        num_heads,
        kvh,
        qkv.shape[-1],
        block_tables.shape[1],
        split_keys,
        splits,
        tiles,
        d**-0.5,
        G=g,
        D=d,
        BS=bs,
        ROWS=rows,
        TILE=tile,
        TOKENS=_pow2(tile),
        BLOCK_N=block_n,
        SPLITS=_pow2(splits) if split else 1,
        IEEE=qkv.dtype == torch.float32,
        KV_FP8=k_pool.dtype == torch.float8_e4m3fn,
        KV_INT8=k_pool.dtype == torch.int8,
        ROW=row,
        ROPE=rope is not None,
        QK_NORM=norms is not None,
        PDL=pdl,
        num_warps=warps,
        num_stages=stages,
        launch_pdl=pdl,
    )
    return out
