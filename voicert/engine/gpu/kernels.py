"""Fused GPU kernels (Triton) for decode and prefill steps: fewer, larger launches per layer.

A small model's decode step is launch-bound: SmolLM2-135M runs ~20 kernels in each of its 30
layers, most of them tiny (RMSNorm, the four ops of RoPE, two KV writes, two KV gathers, layout
copies, SiLU, the multiply, residual adds). These kernels fold them into five or six launches
per layer (two norms, RoPE + KV write, attention and at small batch its combine, SiLU * up)
beside the layer's four GEMMs:

- :func:`add_rms_norm`: residual add + RMSNorm (one pass; the sum is kept as the new residual);
- :func:`rope_kv_write`: RoPE on q and k in place (cos and sin read from the model's tables by
  position), and k/v written into their KV-pool slots;
- :func:`paged_attention`: attention straight from the paged pool through the block table (no
  gathered copy), over tiles of query tokens (a decode step's few, a prefill row's many), split
  over the key axis when the programs are few (flash-decoding); the last split program of each
  tile to finish combines the splits;
- :func:`silu_mul`: SiLU(gate) * up;
- :func:`argmax_rows`: the greedy token of each row of logits, many programs per row, the last
  one to finish reducing their partial results;
- :func:`fp8_linear`: a Linear over FP8 weights (engine/gpu/fp8.py), the weights widened in registers,
  K split over programs when the output has few tiles (the last split to finish adds them); many
  bf16 rows go to the FP8 tensor cores instead (:func:`fp8_rows`, then ``torch._scaled_mm``).

On Hopper and newer GPUs every kernel here can be launched with programmatic dependent launch
(``pdl=True``; the engine's ``llm.pdl``): it may then start while the kernel before it on the
stream still runs. Each program does its index arithmetic (and the FP8 kernel reads its first
weight tile: weights are never written during a step), then waits for the kernel before to have
finished (``griddepcontrol.wait``) before touching anything another kernel writes or reads, then
lets the next kernel start. cuBLAS and torch kernels between them launch as usual and wait for a
full finish. The FP8 kernel also runs bf16/fp16 Linears unscaled (``scale`` None) for small
steps, so that a decode step's GEMMs chain with the rest (``llm.decode_linear``).

"The last program to finish" is a counter per output row, bumped with an acquire-release atomic
after the program's partial results are stored; the program that reads ``count - 1`` reads the
others' partials (from L2, past its own L1) and sets the counter back to zero for the next launch.
Counters are owned by the caller (the model: one engine thread runs it) and must start at zero.

Numerics follow the torch path's order (the residual sum is rounded to the model dtype before it is
normalised; SiLU is rounded before the multiply) but reductions run in a different order, so fp32
results agree to rounding, not bit for bit. Matmuls in fp32 run in IEEE fp32 (never TF32).

Everything here is launched from :class:`voicert.engine.models.llama.LlamaModel` when the model's
``use_kernels`` is set (the engine sets it on CUDA). With ``TRITON_INTERPRET=1`` set before this
module is imported, the same kernels run on CPU tensors (tests do this; it is slow).
"""

from __future__ import annotations

import enum

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

try:  # griddepcontrol, for programmatic dependent launch (Triton 3.6 has it)
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

    HAS_GDC = True
except ImportError:  # older Triton: the kernels run, launched plainly (pdl_supported is False)
    gdc_launch_dependents = gdc_wait = None
    HAS_GDC = False

from voicert.engine.gpu.formats import E4M3_MAX

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


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


@triton.jit
def _pdl_enter(PDL: tl.constexpr):
    """Programmatic dependent launch (Hopper+): a kernel launched with ``launch_pdl`` may start
    while the kernel before it on the stream still runs. It waits here for that kernel to have
    finished (its stores visible) before touching memory another kernel writes or reads, then
    lets the next kernel start its own programs. Every program of every such kernel waits, so a
    kernel's finish still implies its predecessors' (the chain stays ordered)."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()


def pdl_supported(device: torch.device | str) -> bool:
    """Whether kernels on ``device`` can be launched with programmatic dependent launch: a CUDA
    GPU of compute capability 9.0 or newer (``griddepcontrol``), not Triton's CPU interpreter."""
    import os

    dev = torch.device(device)
    return (
        HAS_GDC
        and dev.type == "cuda"
        and torch.cuda.get_device_capability(dev)[0] >= 9
        and os.environ.get("TRITON_INTERPRET", "0") in ("", "0")
    )


# ----------------------------------------------------------------------------- RMSNorm


@triton.jit
def _add_rms_norm_kernel(
    x_ptr,
    res_ptr,
    w_ptr,
    out_ptr,
    p_ptr,
    n_cols,
    eps,
    HAS_RES: tl.constexpr,
    BLOCK: tl.constexpr,
    PLANES: tl.constexpr,
    A8: tl.constexpr,
    PDL: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    m = cols < n_cols
    _pdl_enter(PDL)
    x = tl.load(x_ptr + row * n_cols + cols, mask=m, other=0.0).to(tl.float32)
    if HAS_RES:
        r = tl.load(res_ptr + row * n_cols + cols, mask=m, other=0.0).to(tl.float32)
        s = (r + x).to(res_ptr.dtype.element_ty)  # rounded as the torch path's h + a
        tl.store(res_ptr + row * n_cols + cols, s, mask=m)
        x = s.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    w = tl.load(w_ptr + cols, mask=m, other=0.0).to(tl.float32)
    y = ((x * rstd).to(out_ptr.dtype.element_ty).to(tl.float32) * w).to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + row * n_cols + cols, y, mask=m)
    if PLANES:  # one row, for an INT4 Linear's one-row kernel (groups of PLANES columns)
        _x_planes_put(p_ptr, n_cols // 8, y.to(tl.float32), 0, n_cols, PLANES, BLOCK, A8)


def add_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor,
    eps: float,
    pdl: bool = False,
    planes: torch.Tensor | None = None,
    group: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., n] (contiguous). With ``residual`` (same shape): residual += x in place, and returns
    (rms_norm(residual) * weight, residual). Without: returns (rms_norm(x) * weight, x).
    ``pdl``: launch with programmatic dependent launch (only where :func:`pdl_supported`).
    ``planes`` [10, n // 8] fp32 (one row only): also filled with the output laid out for
    :func:`int4_gemv` in groups of ``group`` (:func:`int4_planes`' values, bit for bit); or
    [4, n // 8] int32: for :func:`int4_gemv_a8` (:func:`int4_a8_planes`' values)."""
    n = x.shape[-1]
    out = torch.empty_like(x)
    rows = x.numel() // n
    res = residual if residual is not None else x
    layout, a8 = _planes_args(planes, rows, n, group)
    _add_rms_norm_kernel[(rows,)](
        x,
        res,
        weight,
        out,
        out if planes is None else planes,
        n,
        eps,
        HAS_RES=residual is not None,
        BLOCK=_pow2(n),
        PLANES=layout,
        A8=a8,
        PDL=pdl,
        num_warps=4 if n <= 4096 else 8,
        launch_pdl=pdl,
    )
    return out, res


# ----------------------------------------------------------------------------- SiLU * up


@triton.jit
def _silu_mul_kernel(
    gu_ptr,
    out_ptr,
    p_ptr,
    inter,
    BLOCK: tl.constexpr,
    PLANES: tl.constexpr,
    A8: tl.constexpr,
    PDL: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    c0 = tl.program_id(1) * BLOCK
    cols = c0 + tl.arange(0, BLOCK)
    m = cols < inter
    _pdl_enter(PDL)
    g = tl.load(gu_ptr + row * 2 * inter + cols, mask=m, other=0.0).to(tl.float32)
    u = tl.load(gu_ptr + row * 2 * inter + inter + cols, mask=m, other=0.0).to(tl.float32)
    act = (g / (1.0 + tl.exp(-g))).to(out_ptr.dtype.element_ty).to(tl.float32)
    y = (act * u).to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + row * inter + cols, y, mask=m)
    if PLANES:  # one row, for an INT4 Linear's one-row kernel (groups of PLANES columns)
        _x_planes_put(p_ptr, inter // 8, y.to(tl.float32), c0, inter, PLANES, BLOCK, A8)


@triton.jit
def _x_planes_put(p_ptr, XS, y, c0, K, GROUP: tl.constexpr, BLOCK: tl.constexpr, A8: tl.constexpr):
    """A kernel that writes an INT4 Linear's one-row x lays it out for the one-row kernel too:
    :func:`_int4_a8_planes_put`'s planes with ``A8``, else :func:`_int4_planes_put`'s."""
    if A8:
        _int4_a8_planes_put(p_ptr, XS, y, c0, K, GROUP, BLOCK)
    else:
        _int4_planes_put(p_ptr, XS, y, c0, K, GROUP, BLOCK)


def silu_mul(
    gate_up: torch.Tensor,
    pdl: bool = False,
    planes: torch.Tensor | None = None,
    group: int = 0,
) -> torch.Tensor:
    """gate_up [..., 2I] (gate first, contiguous) -> silu(gate) * up [..., I]. ``pdl``,
    ``planes`` and ``group``: as :func:`add_rms_norm`'s."""
    inter = gate_up.shape[-1] // 2
    out = gate_up.new_empty(*gate_up.shape[:-1], inter)
    rows = gate_up.numel() // (2 * inter)
    block = max(min(1024, _pow2(inter)), group)
    layout, a8 = _planes_args(planes, rows, inter, group)
    _silu_mul_kernel[(rows, triton.cdiv(inter, block))](
        gate_up,
        out,
        out if planes is None else planes,
        inter,
        BLOCK=block,
        PLANES=layout,
        A8=a8,
        PDL=pdl,
        launch_pdl=pdl,
    )
    return out


def _planes_args(planes: torch.Tensor | None, rows: int, n: int, group: int) -> tuple[int, bool]:
    """The (PLANES, A8) constants of a kernel that writes x and is given ``planes`` (None: (0,
    False)), which must be for one row, in groups of a power of two of at least 8 columns
    dividing n: [10, n // 8] fp32 (:func:`int4_planes`' layout) or [4, n // 8] int32
    (:func:`int4_a8_planes`', A8), contiguous."""
    if planes is None:
        return 0, False
    assert rows == 1 and group >= 8 and group & (group - 1) == 0 and n % group == 0, (rows, n)
    a8 = planes.dtype == torch.int32
    assert planes.shape == (4 if a8 else 10, n // 8), planes.shape
    assert a8 or planes.dtype == torch.float32, planes.dtype
    assert planes.is_contiguous()
    return group, a8


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
    _pdl_enter(PDL)
    row = qkv_ptr + t * (n_rot + kvh_n) * D  # this token's [H + 2 KVH, D]
    heads = tl.arange(0, BLOCK_H)
    d = tl.arange(0, HALF)
    hm = (heads < n_rot)[:, None]
    lo = row + heads[:, None] * D + d[None, :]
    x1 = tl.load(lo, mask=hm, other=0.0).to(tl.float32)
    x2 = tl.load(lo + HALF, mask=hm, other=0.0).to(tl.float32)
    if QK_NORM:  # Qwen3: each q and k head RMS-normalised over D, then RoPE
        is_q = (heads < n_q_heads)[:, None]
        x1, x2 = _head_rms_norm(x1, x2, is_q, qn_ptr, kn_ptr, d, eps, D, qkv_ptr.dtype.element_ty)
    p = tl.minimum(tl.load(pos_ptr + t), n_pos - 1)  # the tables' row for this position
    c = tl.load(cos_ptr + p * HALF + d).to(tl.float32)[None, :]
    sn = tl.load(sin_ptr + p * HALF + d).to(tl.float32)[None, :]
    o1 = (x1 * c + x2 * -sn).to(qkv_ptr.dtype.element_ty)  # x * cos + rotate_half(x) * sin
    o2 = (x2 * c + x1 * sn).to(qkv_ptr.dtype.element_ty)
    tl.store(lo, o1, mask=hm)  # q and k rotated in place
    tl.store(lo + HALF, o2, mask=hm)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    kh = heads - n_q_heads  # rows n_q_heads.. of the rotated block are k heads
    km = ((heads >= n_q_heads) & (heads < n_rot))[:, None]
    krow = k_ptr + slot * kvh_n * ROW + kh * ROW  # [BLOCK_H] each k head's pool row
    kdst = krow[:, None] + d[None, :]
    vh = tl.arange(0, BLOCK_KV)
    dd = tl.arange(0, D)
    vm = (vh < kvh_n)[:, None]
    v = tl.load(row + (n_rot + vh)[:, None] * D + dd[None, :], mask=vm, other=0.0)
    vrow = v_ptr + slot * kvh_n * ROW + vh * ROW  # [BLOCK_KV]
    if KV_INT8:  # each head's row scaled by its largest magnitude / 127, the scale after the row
        k1, k2 = o1.to(tl.float32), o2.to(tl.float32)
        ks = tl.maximum(
            tl.maximum(tl.max(tl.abs(k1), axis=1), tl.max(tl.abs(k2), axis=1)) / 127, 1e-12
        )  # [BLOCK_H]
        tl.store(kdst, _int8(k1 / ks[:, None]), mask=km)
        tl.store(kdst + HALF, _int8(k2 / ks[:, None]), mask=km)
        tl.store(
            (krow + D).to(tl.pointer_type(tl.float32)),
            ks,
            mask=(heads >= n_q_heads) & (heads < n_rot),
        )
        vf = v.to(tl.float32)
        vs = tl.maximum(tl.max(tl.abs(vf), axis=1) / 127, 1e-12)  # [BLOCK_KV]
        tl.store(vrow[:, None] + dd[None, :], _int8(vf / vs[:, None]), mask=vm)
        tl.store((vrow + D).to(tl.pointer_type(tl.float32)), vs, mask=vh < kvh_n)
    else:
        tl.store(kdst, _to_pool(o1, k_ptr, KV_FP8), mask=km)
        tl.store(kdst + HALF, _to_pool(o2, k_ptr, KV_FP8), mask=km)
        tl.store(vrow[:, None] + dd[None, :], _to_pool(v, v_ptr, KV_FP8), mask=vm)


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
def _int8(x):
    """Round half to even and saturate to [-127, 127], as torch.round and clamp do."""
    return tl.clamp(libdevice.rint(x), -127.0, 127.0).to(tl.int8)


@triton.jit
def _to_pool(x, pool_ptr, KV_FP8: tl.constexpr):
    """x in the pool's dtype: an FP8 pool's values clamped to e4m3's range (scale 1), as
    layers.write_kv does."""
    if KV_FP8:
        x = tl.clamp(x.to(tl.float32), -448.0, 448.0)  # +-E4M3_MAX (a literal in a kernel)
    return x.to(pool_ptr.dtype.element_ty)


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
    are not in this program's L1."""
    sp = tl.arange(0, SPLITS)  # all splits in one load: [SPLITS, ROWS] and [SPLITS, ROWS, D]
    idx = (base + sp)[:, None] * ROWS + r[None, :]  # [SPLITS, ROWS]
    sm = (sp < active)[:, None] & valid[None, :]
    m = tl.load(ml_ptr + idx * 2, mask=sm, other=-1.0e30, cache_modifier=".cg")
    l_s = tl.load(ml_ptr + idx * 2 + 1, mask=sm, other=0.0, cache_modifier=".cg")
    w = tl.exp(m - tl.max(m, axis=0)[None, :])  # [SPLITS, ROWS]
    l_all = tl.sum(w * l_s, axis=0)  # [ROWS]
    acc = tl.load(
        part_ptr + idx[:, :, None] * D + d[None, None, :],
        mask=sm[:, :, None],
        other=0.0,
        cache_modifier=".cg",
    )
    return tl.sum(w[:, :, None] * acc, axis=0) / tl.maximum(l_all, 1.0e-30)[:, None]


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
    BLOCK_N: tl.constexpr,
    SPLITS: tl.constexpr,
    IEEE: tl.constexpr,
    KV_INT8: tl.constexpr,
    ROW: tl.constexpr,
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
    _pdl_enter(PDL)
    q = tl.load(
        q_ptr + (b * q_len + qi)[:, None] * q_stride + head[:, None] * D + d[None, :],
        mask=valid[:, None],
        other=0.0,
    )  # [ROWS, D]
    pos = tl.load(pos_ptr + b * q_len + qi, mask=valid, other=-1)  # last key each row may see
    last = tl.max(pos, axis=0)
    start = s * split_keys
    end = tl.minimum(start + split_keys, last + 1)
    m_i = tl.full([ROWS], -1.0e30, tl.float32)
    l_i = tl.zeros([ROWS], tl.float32)
    acc = tl.zeros([ROWS, D], tl.float32)
    for n0 in range(start, end, BLOCK_N):
        keys = n0 + tl.arange(0, BLOCK_N)
        km = keys < end
        page = tl.load(table_ptr + b * max_blocks + keys // BS, mask=km, other=0).to(tl.int64)
        slot = page * BS + keys % BS
        kv_row = (slot * kvh_n + kvh) * ROW  # [BLOCK_N] each key's pool row
        kv_off = kv_row[:, None] + d[None, :]
        k = tl.load(k_ptr + kv_off, mask=km[:, None], other=0.0)  # [BLOCK_N, D]
        if KV_INT8:  # widened by each row's scale, stored after it
            k = (
                k.to(tl.float32)
                * tl.load((k_ptr + kv_row + D).to(tl.pointer_type(tl.float32)), mask=km, other=0.0)[
                    :, None
                ]
            )
        k = k.to(q.dtype)
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
        v = tl.load(v_ptr + kv_off, mask=km[:, None], other=0.0)
        if KV_INT8:
            v = (
                v.to(tl.float32)
                * tl.load((v_ptr + kv_row + D).to(tl.pointer_type(tl.float32)), mask=km, other=0.0)[
                    :, None
                ]
            )
        v = v.to(q.dtype)  # a one-byte pool's values widened
        if IEEE:
            acc = acc * alpha[:, None] + tl.dot(p, v.to(tl.float32), input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
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
            tl.atomic_xchg(count, 0)  # ready for the next launch


def _prefill_rows(heads: int, q_len: int, g: int) -> int:
    """Query rows per program for rows of ``q_len`` tokens over ``heads`` (sequence, KV head)
    pairs with ``g`` query heads each (see _TILE_PROGRAMS)."""
    if _PREFILL_ROWS:
        return max(_PREFILL_ROWS, _pow2(g))
    for rows in (64, 32, 16):
        if rows < g or heads * triton.cdiv(q_len, rows // g) >= _TILE_PROGRAMS:
            return max(rows, _pow2(g))
    return max(16, _pow2(g))


def counters(device: torch.device | str, n: int = 4096) -> torch.Tensor:
    """Zeroed int32 counters for :func:`paged_attention` and :func:`argmax_rows` (each launch
    leaves them at zero again). One set per caller that launches on one stream at a time."""
    return torch.zeros(n, dtype=torch.int32, device=device)


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
) -> torch.Tensor:
    """Causal attention of Q new tokens per sequence over the paged pool (their own k/v already
    written). qkv [B, Q, (H + 2 KVH) * D] (q heads first, rotated); k_pool/v_pool [NB, BS, KVH, D]
    (qkv's dtype, or llm.kv_cache's float8_e4m3fn or int8 with scales, widened as read);
    block_tables [B, MB] int64; positions [B, Q] int64 (query q sees keys 0..positions[b, q]);
    count: zeroed int32 counters from :func:`counters` (None: fresh ones for this call); ``pdl``:
    as :func:`add_rms_norm`'s. Returns [B, Q, H * D].

    A program takes a tile of query tokens of one sequence and the query heads of one KV head
    (16 rows: a decode or verify step's tokens fit one tile; more: :func:`_prefill_rows`' tiles,
    several per prefill row), and one split of the key axis: splits are added while the programs are fewer than
    an H100 has SMs, and the last split of each tile to finish merges them."""
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
        block_n = _TILE_BLOCK_N or min(128, max(16, 8192 // d))
    else:
        block_n = _DECODE_BLOCK_N or (64 if d <= 64 else 128 if d == 128 else 32)
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
        BLOCK_N=block_n,
        SPLITS=_pow2(splits) if split else 1,
        IEEE=qkv.dtype == torch.float32,
        KV_INT8=k_pool.dtype == torch.int8,
        ROW=row,
        PDL=pdl,
        num_warps=4,
        launch_pdl=pdl,
    )
    return out


# ----------------------------------------------------------------------------- greedy pick

_ARGMAX_BLOCK = 4096  # logits per program


@triton.jit
def _argmax_kernel(
    x_ptr,
    part_v_ptr,
    part_i_ptr,
    count_ptr,
    out_ptr,
    n_cols,
    inner,
    out_stride,
    BLOCK: tl.constexpr,
    CHUNKS: tl.constexpr,
    PDL: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    chunks = tl.num_programs(1)
    cols = c * BLOCK + tl.arange(0, BLOCK)
    _pdl_enter(PDL)
    x = tl.load(x_ptr + row * n_cols + cols, mask=cols < n_cols, other=float("-inf"))
    x = x.to(tl.float32)
    best = tl.max(x, axis=0)
    at = tl.min(tl.where(x == best, cols, n_cols), axis=0)  # the first column holding the max
    tl.store(part_v_ptr + row * chunks + c, best)
    tl.store(part_i_ptr + row * chunks + c, at)
    tl.debug_barrier()
    if tl.atomic_add(count_ptr + row, 1, sem="acq_rel") == chunks - 1:
        k = tl.arange(0, CHUNKS)
        km = k < chunks
        v = tl.load(
            part_v_ptr + row * chunks + k, mask=km, other=float("-inf"), cache_modifier=".cg"
        )
        i = tl.load(part_i_ptr + row * chunks + k, mask=km, other=n_cols, cache_modifier=".cg")
        top = tl.max(v, axis=0)
        pick = tl.min(tl.where(v == top, i, n_cols), axis=0)  # ties: the lowest column
        tl.store(out_ptr + (row // inner) * out_stride + row % inner, pick.to(tl.int64))
        tl.atomic_xchg(count_ptr + row, 0)


def argmax_rows(
    x: torch.Tensor,
    count: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    pdl: bool = False,
) -> torch.Tensor:
    """x [..., V] (contiguous) -> the index of each row's largest value, int64 [...] (ties: the
    first, as ``torch.argmax``). count: zeroed int32 counters, one per row (None: fresh ones).
    out: where to write, a [R // inner, inner] view with any row stride of a longer buffer.
    ``pdl``: as :func:`add_rms_norm`'s."""
    n = x.shape[-1]
    rows = x.numel() // n
    if out is None:
        out = torch.empty(x.shape[:-1], dtype=torch.long, device=x.device)
    out2 = out.view(-1, out.shape[-1]) if out.dim() > 0 else out.view(1, 1)
    assert out2.shape[0] * out2.shape[1] == rows and out2.stride(-1) == 1
    if count is None:
        count = counters(x.device, rows)
    assert count.numel() >= rows
    chunks = triton.cdiv(n, _ARGMAX_BLOCK)
    part_v = torch.empty(rows * chunks, dtype=torch.float32, device=x.device)
    part_i = torch.empty(rows * chunks, dtype=torch.int32, device=x.device)
    _argmax_kernel[(rows, chunks)](
        x,
        part_v,
        part_i,
        count,
        out2,
        n,
        out2.shape[1],
        out2.stride(0),
        BLOCK=_ARGMAX_BLOCK,
        CHUNKS=_pow2(chunks),
        PDL=pdl,
        num_warps=8,
        launch_pdl=pdl,
    )
    return out


# ----------------------------------------------------------------------------- FP8 weights


@triton.jit
def _fp8_linear_kernel(
    x_ptr,
    w_ptr,
    s_ptr,
    b_ptr,
    out_ptr,
    part_ptr,
    count_ptr,
    M,
    N,
    K,
    stride_xm,
    k_per_split,
    HAS_SCALE: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    IEEE: tl.constexpr,
    SPLIT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PDL: tl.constexpr,
):
    pid_n, pid_m, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    mm, nm = rm < M, rn < N
    k_lo = pid_k * k_per_split
    k_hi = tl.minimum(k_lo + k_per_split, K)
    x_ptrs = x_ptr + rm[:, None].to(tl.int64) * stride_xm + (k_lo + rk)[None, :]  # [BM, BK]
    w_ptrs = w_ptr + rn[:, None].to(tl.int64) * K + (k_lo + rk)[None, :]  # [BN, BK]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    # the first weight tile is read before waiting for the kernel before (PDL): the weights are
    # never written during a step, so their loads overlap that kernel's tail (the loop peeled)
    km = (k_lo + rk) < k_hi
    w_first = tl.load(w_ptrs, mask=nm[:, None] & km[None, :], other=0.0)
    _pdl_enter(PDL)
    x_first = tl.load(x_ptrs, mask=mm[:, None] & km[None, :], other=0.0)
    acc = _fp8_dot(x_first, w_first.to(x_first.dtype), acc, IEEE)
    x_ptrs += BLOCK_K
    w_ptrs += BLOCK_K
    for k0 in range(k_lo + BLOCK_K, k_hi, BLOCK_K):
        km = (k0 + rk) < k_hi
        x = tl.load(x_ptrs, mask=mm[:, None] & km[None, :], other=0.0)
        w = tl.load(w_ptrs, mask=nm[:, None] & km[None, :], other=0.0).to(x.dtype)
        acc = _fp8_dot(x, w, acc, IEEE)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    _split_k_finish(
        acc, rm, rn, mm, nm, M, N, s_ptr, b_ptr, out_ptr, part_ptr, count_ptr,
        SPLIT, HAS_SCALE, HAS_BIAS,
    )  # fmt: skip


@triton.jit
def _fp8_dot(x, w, acc, IEEE: tl.constexpr):
    """acc + x [BM, BK] @ w [BN, BK]^T, in IEEE fp32 for fp32 inputs."""
    if IEEE:
        return tl.dot(x, tl.trans(w), acc, input_precision="ieee")
    return tl.dot(x, tl.trans(w), acc)


@triton.jit
def _fp8_epilogue(
    acc,
    s_ptr,
    b_ptr,
    out_ptr,
    at,
    rn,
    nm,
    out_mask,
    HAS_SCALE: tl.constexpr,
    HAS_BIAS: tl.constexpr,
):
    if HAS_SCALE:
        acc = acc * tl.load(s_ptr + rn, mask=nm, other=0.0)[None, :]
    if HAS_BIAS:
        acc += tl.load(b_ptr + rn, mask=nm, other=0.0).to(tl.float32)[None, :]
    tl.store(out_ptr + at, acc.to(out_ptr.dtype.element_ty), mask=out_mask)


@triton.jit
def _split_k_finish(
    acc,
    rm,
    rn,
    mm,
    nm,
    M,
    N,
    s_ptr,
    b_ptr,
    out_ptr,
    part_ptr,
    count_ptr,
    SPLIT: tl.constexpr,
    HAS_SCALE: tl.constexpr,
    HAS_BIAS: tl.constexpr,
):
    """A program's output tile acc [BM, BN] (fp32; rows rm, columns rn, their masks mm, nm) to
    out [M, N] through :func:`_fp8_epilogue`. ``SPLIT`` > 1 (K split over the grid's third
    axis): each split stores its partial sums in part [SPLIT, M, N] and the last of the tile's
    programs to finish (``count_ptr``'s counter, one per tile, left at zero again) adds them up
    and writes the tile."""
    out_mask = mm[:, None] & nm[None, :]
    at = rm[:, None].to(tl.int64) * N + rn[None, :]  # [BM, BN] offsets into [M, N]
    if SPLIT > 1:
        tl.store(part_ptr + tl.program_id(2) * M * N + at, acc, mask=out_mask)
        tl.debug_barrier()
        tile = tl.program_id(1) * tl.num_programs(0) + tl.program_id(0)
        if tl.atomic_add(count_ptr + tile, 1, sem="acq_rel") == SPLIT - 1:
            total = tl.zeros(acc.shape, dtype=tl.float32)
            for sp in tl.static_range(SPLIT):
                total += tl.load(
                    part_ptr + sp * M * N + at, mask=out_mask, other=0.0, cache_modifier=".cg"
                )
            _fp8_epilogue(total, s_ptr, b_ptr, out_ptr, at, rn, nm, out_mask, HAS_SCALE, HAS_BIAS)
            tl.atomic_xchg(count_ptr + tile, 0)
    else:
        _fp8_epilogue(acc, s_ptr, b_ptr, out_ptr, at, rn, nm, out_mask, HAS_SCALE, HAS_BIAS)


def _split_k(
    out: torch.Tensor, k: int, split: int, step: int, tiles: int, count: torch.Tensor | None
) -> tuple[int, int, torch.Tensor, torch.Tensor | None]:
    """For a kernel whose programs each sum a part of K into ``out`` [M, N] (finished by
    :func:`_split_k_finish`): (columns a part, parts, where the parts' sums go, counters).
    ``split`` parts are asked for, each a whole number of ``step`` columns, so fewer may come;
    with more than one, the partial sums go to a new float32 [parts, M, N] and ``count`` (one
    zeroed counter per output tile, ``tiles`` of them; None: fresh ones) orders the finish."""
    per = triton.cdiv(triton.cdiv(k, split), step) * step
    split = triton.cdiv(k, per)
    if split == 1:
        return per, 1, out, count
    part = torch.empty(split, *out.shape, dtype=torch.float32, device=out.device)
    if count is None:
        count = counters(out.device, tiles)
    assert count.numel() >= tiles
    return per, split, part, count


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
    PDL: tl.constexpr,
):
    """:func:`_fp8_linear_kernel` for one row on the CUDA cores, no MMA: each weight tile
    [BN, BK] is widened to fp32 and multiplied by x's columns into a [BN, BK] accumulator by
    FMAs, summed over K once at the end (no reduction across threads in the loop). PRE (1, 2
    or 4): weight tiles loaded before the wait for the kernel before (PDL), so a program
    started during that kernel's tail streams its weights meanwhile. X_WIDE: one-byte weights
    read 8 bytes at a time, not 16, so that their tile takes x's layout (bf16 x in 16-byte
    vectors) and x is not moved through shared memory, with two barriers, every step."""
    pid_n, pid_k = tl.program_id(0), tl.program_id(2)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
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
    rm = tl.arange(0, 1)
    _split_k_finish(
        tl.sum(acc, axis=1)[None, :], rm, rn, rm < 1, nm, 1, N, s_ptr, b_ptr, out_ptr, part_ptr,
        count_ptr, SPLIT, HAS_SCALE, HAS_BIAS,
    )  # fmt: skip


GEMV_ROWS = 1  # steps of this many rows take gemv in fp8_linear (docs/benchmarks.md section 59)
GEMV_MAX_N = 65536  # ... for FP8 weights of at most this many outputs: an FP8 LM head's 128k
# columns stream faster through the MMA kernel's wider tiles (H100); bf16 ones do not
GEMV_TILE = (4, 1024, 4)  # its (BLOCK_N, BLOCK_K, num_warps): the best one setting, H100
GEMV_X_WIDE = True  # FP8 weights read in x's layout (_gemv_kernel's X_WIDE), no shared memory
# a step: 8B FP8 layers 10 % faster (gate_up 35.9 -> 32.8 us), TPOT 3.14 -> 3.03 ms, 1B 0.88 ->
# 0.85 (H200, docs/benchmarks.md 67)
GEMV_PRE = {1: 4}  # weight tiles loaded before the PDL wait, by weight bytes (else 1): FP8
# layers 5 % faster with 4; bf16 ones 3-5 % slower with 2 or 4 (section 59)


def gemv(
    x2: torch.Tensor,
    w: torch.Tensor,
    scale: torch.Tensor | None,
    bias: torch.Tensor | None,
    count: torch.Tensor | None = None,
    blocks: tuple[int, ...] = GEMV_TILE,
    pdl: bool = False,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """One row x2 [1, K] times w [N, K] (FP8 with ``scale`` [N] float32, or unscaled in x2's
    dtype) plus ``bias`` [N] -> [1, N] in x2's dtype, on the CUDA cores (:func:`_gemv_kernel`):
    at one row a step only streams the weights, and FMAs over the widened tile read them
    faster than the MMA kernel's 16-row tiles do. ``blocks``: (BLOCK_N, BLOCK_K, num_warps[,
    SPLIT[, PRE]]); SPLIT 0 or absent: K is split until there are :data:`FP8_PROGRAMS`
    programs; PRE: weight tiles read before the PDL wait (absent: :data:`GEMV_PRE` by the
    weights' bytes). ``count``: as :func:`fp8_linear`'s. ``pdl``: as :func:`add_rms_norm`'s.
    ``out``: where to write (N contiguous values in x2's dtype; None: a new [1, N])."""
    m, k = x2.shape
    assert m == 1 and x2.stride(-1) == 1, x2.shape
    n = w.shape[0]
    bn, bk, warps = blocks[:3]
    split = blocks[3] if len(blocks) > 3 else 0
    pre = blocks[4] if len(blocks) > 4 else GEMV_PRE.get(w.element_size(), 1)
    tiles = triton.cdiv(n, bn)
    if not split:
        split = _split_rule(tiles, k)
    if out is None:
        out = torch.empty(1, n, dtype=x2.dtype, device=x2.device)
    assert out.is_contiguous() and out.numel() == n and out.dtype == x2.dtype
    k_per_split, split, part, count = _split_k(out.view(1, n), k, split, bk, tiles, count)
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
        PDL=pdl,
        num_warps=warps,
        num_stages=1,
        launch_pdl=pdl,
    )
    return out


FP8_PROGRAMS = 264  # aim for at least this many programs (two per SM of an H100's 132)
FP8_MIN_SPLIT_K = 512  # a split of K streams at least this many columns


def _split_rule(
    tiles: int, k: int, least: int = FP8_MIN_SPLIT_K, programs: int = FP8_PROGRAMS
) -> int:
    """How many parts to split K into for ``tiles`` output tiles: until there are ``programs``
    programs, at most 16 parts, each at least ``least`` columns."""
    return max(1, min(16, triton.cdiv(programs, tiles), k // least))


def fp8_blocks(m: int, n: int, k: int, wbytes: int = 1) -> tuple[int, int, int, int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages, SPLIT_K) for :func:`fp8_linear` on
    x [m, k] and weights [n, k] of ``wbytes`` bytes each. Up to 64 rows (decode, verify): the
    step streams the weights, so every weight tile is read once (one M tile) and K is split
    until there are enough programs to keep every SM reading (a 2048-wide output has only 64
    tiles of 32). More rows (prefill): square-ish tiles for the tensor cores, no split. Two-byte
    weights at up to 16 rows: 64 x 128 tiles, the best single setting of
    ``scripts/gpu/gemv_bf16.py`` on an H100 (:func:`linear_tiles` holds each shape's best)."""
    if m > 64:
        return 64, 128, 64, 4, 3, 1
    bm = 16 if m <= 16 else _pow2(m)
    bn, bk = ((32, 256) if wbytes == 1 else (64, 128)) if m <= 16 else (64, 128)
    tiles = triton.cdiv(n, bn)
    split = _split_rule(tiles, k)
    return bm, bn, bk, 4, 4, split


def fp8_linear(
    x: torch.Tensor,
    w: torch.Tensor,
    scale: torch.Tensor | None,
    bias: torch.Tensor | None,
    count: torch.Tensor | None = None,
    blocks: tuple[int, ...] | None = None,
    pdl: bool = False,
    round_rows: bool = True,
) -> torch.Tensor:
    """x [..., K] (bf16, fp16 or fp32) times FP8 weights w [N, K] (float8_e4m3fn, contiguous) with
    per-row scales [N] float32, plus ``bias`` [N] -> [..., N] in x's dtype. With ``scale`` None,
    w is in x's dtype and used as it is: a plain Linear for few rows through the same kernel
    (launched like the step's other kernels, so with ``pdl`` it chains). The weights are widened
    to x's dtype in registers; the sums run in fp32 (IEEE for fp32 inputs). One row
    (:data:`GEMV_ROWS`) goes to :func:`gemv`, the same sums on the CUDA cores (FP8 weights:
    up to :data:`GEMV_MAX_N` outputs). Bf16/fp16 rows up to :data:`FP8_MM_ROWS` with FP8
    weights go to :func:`fp8_mm`, more than ``FP8_MMA_ROWS`` to :func:`fp8_scaled_mm` (the
    activations rounded to FP8 too: the tensor cores beat widening there); fp32 inputs, the
    exactness tests' dtype, always take the widening kernel there. ``count``: zeroed int32
    counters, one per output tile, for a split over K (None: fresh ones; the model keeps one set,
    see :func:`counters`). ``blocks``: the MMA kernel's tiles, overriding :func:`fp8_blocks`
    (given, that kernel runs at any row count: the benchmarks try tiles; five numbers: the
    split is then chosen as by default). ``pdl``: as :func:`add_rms_norm`'s. ``round_rows``
    False (``llm.fp8_activations: model``): bf16/fp16 rows are never rounded to FP8; more than
    one take the widening kernel at any row count."""
    n, k = w.shape
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    m = x2.shape[0]
    if blocks is None and m <= GEMV_ROWS and (n <= GEMV_MAX_N or w.element_size() > 1):
        return gemv(x2, w, scale, bias, count, GEMV_TILE, pdl).view(*x.shape[:-1], n)
    if (
        blocks is None
        and round_rows
        and 2 <= m <= FP8_MM_ROWS
        and x.dtype in (torch.bfloat16, torch.float16)
        and w.dtype == torch.float8_e4m3fn
    ):
        assert scale is not None
        return fp8_mm(x2, w, scale, bias, count, None, pdl).view(*x.shape[:-1], n)
    if (
        blocks is None
        and round_rows
        and m > FP8_MMA_ROWS
        and x.dtype in (torch.bfloat16, torch.float16)
        and w.dtype == torch.float8_e4m3fn
        and k % 16 == 0
        and n % 16 == 0
    ):
        return fp8_scaled_mm(x2, w, scale, bias, pdl).view(*x.shape[:-1], n)
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    default = fp8_blocks(m, n, k, w.element_size())
    bm, bn, bk, warps, stages, split = tuple(blocks) + default[len(blocks) :] if blocks else default
    grid_n, grid_m = triton.cdiv(n, bn), triton.cdiv(m, bm)
    k_per_split, split, part, count = _split_k(out, k, split, bk, grid_n * grid_m, count)
    _fp8_linear_kernel[(grid_n, grid_m, split)](
        x2,
        w,
        w if scale is None else scale,
        w if bias is None else bias,
        out,
        part,
        w if count is None else count,
        m,
        n,
        k,
        x2.stride(0),
        k_per_split,
        HAS_SCALE=scale is not None,
        HAS_BIAS=bias is not None,
        IEEE=x.dtype == torch.float32,
        SPLIT=split,
        BLOCK_M=bm,
        BLOCK_N=bn,
        BLOCK_K=bk,
        PDL=pdl,
        num_warps=warps,
        num_stages=stages,
        launch_pdl=pdl,
    )
    return out.view(*x.shape[:-1], n)


@triton.jit
def _fp8_rows_kernel(
    x_ptr, q_ptr, s_ptr, K, stride_xm, QMAX: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    m = cols < K
    _pdl_enter(PDL)
    x = tl.load(x_ptr + row * stride_xm + cols, mask=m, other=0.0).to(tl.float32)
    scale = tl.maximum(tl.max(tl.abs(x), axis=0), 1e-12) / QMAX
    q = tl.minimum(tl.maximum(x / scale, -QMAX), QMAX)
    tl.store(q_ptr + row * K + cols, q.to(q_ptr.dtype.element_ty), mask=m)
    tl.store(s_ptr + row, scale)


def fp8_rows(x2: torch.Tensor, pdl: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """x2 [M, K] -> (FP8 e4m3 [M, K], float32 scales [M, 1]) with one scale per row (its largest
    magnitude maps to 448): the activations' side of :func:`fp8_scaled_mm`, in one launch.
    ``pdl``: as :func:`add_rms_norm`'s."""
    m, k = x2.shape
    q = torch.empty(m, k, dtype=torch.float8_e4m3fn, device=x2.device)
    s = torch.empty(m, 1, dtype=torch.float32, device=x2.device)
    _fp8_rows_kernel[(m,)](
        x2,
        q,
        s,
        k,
        x2.stride(0),
        QMAX=E4M3_MAX,
        BLOCK=_pow2(k),
        PDL=pdl,
        num_warps=4 if k <= 4096 else 8,
        launch_pdl=pdl,
    )
    return q, s


def fp8_scaled_mm(
    x2: torch.Tensor,
    w: torch.Tensor,
    scale: torch.Tensor,
    bias: torch.Tensor | None,
    pdl: bool = False,
) -> torch.Tensor:
    """x2 [M, K] (bf16 or fp16) with FP8 weights w [N, K] on the FP8 tensor cores: the rows
    quantized to e4m3 with a scale each (:func:`fp8_rows`), then ``torch._scaled_mm`` with row-
    and column-wise scales -> [M, N] in x2's dtype. For many rows (prefill, wide batches), where
    widening the weights in registers (:func:`fp8_linear`'s kernel) loses to the tensor cores.
    Rows stay independent of each other, but the activations are rounded to FP8 too."""
    q, sx = fp8_rows(x2, pdl)
    out = torch._scaled_mm(q, w.t(), scale_a=sx, scale_b=scale.view(1, -1), out_dtype=x2.dtype)
    return out if bias is None else out + bias


@triton.jit
def _fp8_mm_kernel(
    q_ptr,
    xs_ptr,
    w_ptr,
    s_ptr,
    b_ptr,
    out_ptr,
    part_ptr,
    count_ptr,
    M,
    N,
    K,
    k_per_split,
    HAS_BIAS: tl.constexpr,
    SPLIT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PDL: tl.constexpr,
):
    """out [M, N] = (q [M, K] FP8 times its row scales xs [M]) @ (w [N, K] FP8 times its row
    scales s [N])^T, plus the bias, on the FP8 tensor cores with the weights as the MMA's first
    operand: acc^T [BN, BM] += w tile [BN, BK] @ q tile^T [BK, BM], both FP8 as they lie in
    memory (nothing widened, so they may stream to the MMA through shared memory alone), fp32
    sums: each K tile's sum is added into acc in fp32, as DeepSeek-V3's FP8 GEMMs promote theirs
    (Triton's default on sm_90 leaves all of K in the MMA's accumulator, which keeps fewer bits:
    ~2^-13 of a sum within one tile, measured on an H200; promoting costs an 8B step 1-2 %,
    docs/benchmarks.md 69). A few rows of q pad only the MMA's narrow side. K split SPLIT ways as
    :func:`_split_k_finish` does (the row scales applied before, the column scales there)."""
    pid_n, pid_m, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rk = tl.arange(0, BLOCK_K)
    nm, mm = rn < N, rm < M
    k_lo = pid_k * k_per_split
    k_hi = tl.minimum(k_lo + k_per_split, K)
    w_ptrs = w_ptr + rn[:, None].to(tl.int64) * K + (k_lo + rk)[None, :]  # [BN, BK]
    q_ptrs = q_ptr + rm[:, None].to(tl.int64) * K + (k_lo + rk)[None, :]  # [BM, BK]
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)  # (out^T)
    _pdl_enter(PDL)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        km = (k0 + rk) < k_hi
        w = tl.load(w_ptrs, mask=nm[:, None] & km[None, :], other=0.0)
        q = tl.load(q_ptrs, mask=mm[:, None] & km[None, :], other=0.0)
        acc = tl.dot(w, tl.trans(q), acc, max_num_imprecise_acc=BLOCK_K)
        w_ptrs += BLOCK_K
        q_ptrs += BLOCK_K
    acc = tl.trans(acc) * tl.load(xs_ptr + rm, mask=mm, other=0.0)[:, None]  # [BM, BN]
    _split_k_finish(
        acc, rm, rn, mm, nm, M, N, s_ptr, b_ptr, out_ptr, part_ptr, count_ptr, SPLIT, True,
        HAS_BIAS,
    )  # fmt: skip


def fp8_mm(
    x2: torch.Tensor,
    w: torch.Tensor,
    scale: torch.Tensor,
    bias: torch.Tensor | None,
    count: torch.Tensor | None = None,
    blocks: tuple[int, ...] | None = None,
    pdl: bool = False,
) -> torch.Tensor:
    """x2 [M, K] (bf16 or fp16) with FP8 weights w [N, K] (row scales ``scale`` [N]) plus
    ``bias`` -> [M, N] in x2's dtype on the FP8 tensor cores, for a few rows (decode steps of
    several streams): the rows rounded to e4m3 with a scale each (:func:`fp8_rows`, as
    :func:`fp8_scaled_mm` does), then :func:`_fp8_mm_kernel`, the weights the MMA's first
    operand, K split as a decode step's Linears are. ``blocks``: (BLOCK_M, BLOCK_N, BLOCK_K,
    num_warps, num_stages[, SPLIT]) (None: :func:`fp8_mm_blocks`; no SPLIT, or 0: by
    :func:`_split_rule`). ``count``: as
    :func:`fp8_linear`'s. ``pdl``: as :func:`add_rms_norm`'s (both launches)."""
    m, k = x2.shape
    n = w.shape[0]
    q, xs = fp8_rows(x2, pdl)
    bm, bn, bk, warps, stages, split = (*blocks, 0)[:6] if blocks else fp8_mm_blocks(m, n, k)
    out = torch.empty(m, n, dtype=x2.dtype, device=x2.device)
    grid_n, grid_m = triton.cdiv(n, bn), triton.cdiv(m, bm)
    split = split or _split_rule(grid_n * grid_m, k)
    k_per_split, split, part, count = _split_k(out, k, split, bk, grid_n * grid_m, count)
    _fp8_mm_kernel[(grid_n, grid_m, split)](
        q,
        xs,
        w,
        scale,
        w if bias is None else bias,
        out,
        part,
        w if count is None else count,
        m,
        n,
        k,
        k_per_split,
        HAS_BIAS=bias is not None,
        SPLIT=split,
        BLOCK_M=bm,
        BLOCK_N=bn,
        BLOCK_K=bk,
        PDL=pdl,
        num_warps=warps,
        num_stages=stages,
        launch_pdl=pdl,
    )
    return out


def fp8_mm_blocks(m: int, n: int, k: int) -> tuple[int, int, int, int, int, int]:
    """:func:`fp8_mm`'s (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages, SPLIT) for x [m, k]
    and weights [n, k]: the rows padded to 16 or the next power of two (at most 64 in a tile).
    Across the weights, 128-wide tiles unsplit where there are enough of them for every SM
    (:data:`FP8_SMS`; Llama-8B's gate_up); else 64-wide tiles, K split until there are
    :data:`FP8_PROGRAMS` programs (half that above 32 rows, whose programs do more sums). On
    an H200's Llama-8B shapes a layer took 1-3 % longer than with each Linear's best split of
    64- and 128-wide tiles, at 2-64 rows (scripts/gpu/fp8_rows.py, docs/benchmarks.md 69)."""
    bm = min(64, max(16, _pow2(m)))
    bk, warps, stages = FP8_MM_TILE
    if triton.cdiv(n, 128) >= FP8_SMS:
        return bm, 128, bk, warps, stages, 1
    programs = FP8_PROGRAMS if m <= 32 else FP8_PROGRAMS // 2
    return bm, 64, bk, warps, stages, _split_rule(triton.cdiv(n, 64), k, programs=programs)


FP8_MM_ROWS = 64  # bf16/fp16 steps of 2 to this many rows with FP8 weights take fp8_mm (the
# activations rounded to FP8 per row, as vLLM's FP8 does at every size): 8B TPOT at 8 / 32 / 64
# streams 3.99 / 4.99 / 5.45 -> 3.19 / 3.67 / 4.55 ms (H200, docs/benchmarks.md 69)
FP8_MM_TILE = (128, 4, 4)  # ... its (BLOCK_K, num_warps, num_stages)
FP8_SMS = 132  # an H100's SMs (an H200's too)
FP8_MMA_ROWS = 32  # above this many rows, bf16/fp16 inputs go to fp8_scaled_mm (Hopper, Ada)
LINEAR_ROWS = 16  # steps of at most this many rows may run bf16/fp16 Linears through fp8_linear


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
    # [g, half, word, column of four]: a word's eight columns share (g, word)
    xs = tl.sum(tl.sum(tl.reshape(y, (G, 2, WPG, 4)), axis=3), axis=1)  # [G, WPG]
    xp = tl.sum(tl.sum(tl.reshape(ys, (G, 2, WPG, 4)), axis=3), axis=1)
    wi = (c0 // GROUP + tl.arange(0, G))[:, None] * WPG + tl.arange(0, WPG)[None, :]
    tl.store(p_ptr + 8 * XS + wi, -xp, mask=wi < K // 8)
    tl.store(p_ptr + 9 * XS + wi, xs, mask=wi < K // 8)


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


def linear_tiles(gpu: str, dtype: torch.dtype) -> dict[tuple[int, int], tuple]:
    """The measured best :func:`fp8_linear` tiles for unscaled ``dtype`` weights at 2 to
    :data:`LINEAR_ROWS` rows (one row takes :func:`gemv`, not these tiles) on the GPU model
    named ``gpu`` (``torch.cuda.get_device_name``), per weight shape (N, K): (BLOCK_M, BLOCK_N,
    BLOCK_K, num_warps, num_stages), from ``engine/data/linear_tiles.json``
    (``scripts/gpu/gemv_bf16.py --json`` writes it). A fixed table, not timed at start, so an
    engine computes the same bits on every start. Empty for a GPU or dtype it does not list
    (the :func:`fp8_blocks` rule then)."""
    import json
    from importlib import resources

    table = json.loads(
        resources.files("voicert.engine").joinpath("data/linear_tiles.json").read_text()
    )
    shapes = table["devices"].get(gpu, {}).get(str(dtype).removeprefix("torch."), {})
    return {tuple(int(d) for d in key.split("x")): tuple(v) for key, v in shapes.items()}


# ----------------------------------------------------------------------------- step inputs


@triton.jit
def _feed_kernel(
    ids_ptr,
    pos_ptr,
    slot_ptr,
    src_ptr,
    table_ptr,
    out_ptr,
    acc_ptr,
    out_stride,
    n_out,
    max_blocks,
    W: tl.constexpr,
    BS: tl.constexpr,
    BLOCK_W: tl.constexpr,
):
    i = tl.program_id(0).to(tl.int64)
    j = tl.load(src_ptr + i * W)
    if j >= 0:
        n = tl.load(acc_ptr + j)  # drafts the previous step accepted in its row j
        t = tl.arange(0, BLOCK_W)
        tm = t < W
        tok = tl.load(out_ptr + t * out_stride + j * W + n, mask=tm & (t < n_out), other=0)
        tl.store(ids_ptr + i * W + t, tok, mask=tm)
        p = tl.load(pos_ptr + i * W + t, mask=tm, other=0) - (W - 1) + n
        tl.store(pos_ptr + i * W + t, p, mask=tm)
        page = tl.load(table_ptr + i * max_blocks + p // BS, mask=tm, other=0)
        tl.store(slot_ptr + i * W + t, page * BS + p % BS, mask=tm)


@triton.jit
def _accept_kernel(ids_ptr, out_ptr, acc_ptr, W: tl.constexpr, BLOCK_W: tl.constexpr):
    i = tl.program_id(0).to(tl.int64)
    t = tl.arange(0, BLOCK_W)
    m = t < W - 1
    d = tl.load(ids_ptr + i * W + 1 + t, mask=m, other=0)
    g = tl.load(out_ptr + i * W + t, mask=m, other=0)
    first_miss = tl.min(tl.where(m & (d == g), W - 1, t), axis=0)
    tl.store(acc_ptr + i, first_miss.to(tl.int64))


def feed_step(
    ids: torch.Tensor,
    pos: torch.Tensor,
    slots: torch.Tensor,
    src: torch.Tensor,
    tables: torch.Tensor,
    out: torch.Tensor,
    acc: torch.Tensor,
    block_size: int,
) -> None:
    """A decode step's inputs taken from the previous step's results on the GPU, in place.

    ids/pos/slots/src [B, W] int64 (W = 1 + drafts per row); tables [B, MB]; out [1 + heads, N]
    (the previous step's greedy tokens, then each draft head's guesses, at every position of its
    [B', W] rows); acc [B'] (drafts its rows accepted, see :func:`accept_counts`). For each row i
    with src[i, 0] = j >= 0: n = acc[j]; the row feeds the greedy token after the last accepted
    position (out[0, j * W + n]) and the heads' guesses there (out[1 + h, j * W + n]); its staged
    positions, laid out for the most drafts the previous step could accept (n = W - 1), move to
    pos - (W - 1) + n, and its KV slots follow through its block table. Rows with src < 0 keep
    their staged inputs."""
    b, w = ids.shape
    _feed_kernel[(b,)](
        ids,
        pos,
        slots,
        src,
        tables,
        out,
        acc,
        out.stride(0),
        out.shape[0],
        tables.shape[1],
        W=w,
        BS=block_size,
        BLOCK_W=_pow2(w),
        num_warps=1,
    )


def accept_counts(ids: torch.Tensor, out: torch.Tensor, acc: torch.Tensor) -> None:
    """acc[i] = how many of row i's drafts (ids[i, 1:]) the step's greedy tokens (out [B * W],
    row-major) confirm before the first disagreement: what ``accept_greedy`` keeps, less the
    target's own token. ids [B, W] int64; acc [>= B] int64, written in place."""
    b, w = ids.shape
    _accept_kernel[(b,)](ids, out, acc, W=w, BLOCK_W=max(2, _pow2(w)), num_warps=1)
