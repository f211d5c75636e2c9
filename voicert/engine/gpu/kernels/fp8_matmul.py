"""Linears over FP8 weights (engine/gpu/fp8.py) at every row count; :func:`fp8_linear` chooses:
one row by :func:`gemv` (matvec.py), 2 to :data:`FP8_MM_ROWS` bf16 rows by :func:`fp8_mm` on
the FP8 tensor cores (the rows rounded to FP8 by :func:`fp8_rows`), more by cuBLAS
(:func:`fp8_scaled_mm`), and fp32 rows, or rows kept in their dtype, by the widening kernel.
The widening kernel also runs bf16 / fp16 Linears of few rows (:func:`linear_tiles`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from voicert.engine.gpu.formats import E4M3_MAX
from voicert.engine.gpu.kernels import matvec
from voicert.engine.gpu.kernels.common import (
    FP8_PROGRAMS,
    _fp8_dot,
    _pdl_enter,
    _pow2,
    _split_k,
    _split_k_finish,
    _split_rule,
    tma_supported,
)
from voicert.engine.gpu.kernels.matvec import gemv
from voicert.engine.gpu.kernels.norms import silu_mul

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


GEMV_ROWS = 1  # steps of this many rows take gemv in fp8_linear (docs/benchmarks.md section 59)
GEMV_MAX_N = 65536  # ... for FP8 weights of at most this many outputs: an FP8 LM head's 128k
# columns stream faster through the MMA kernel's wider tiles (H100); bf16 ones do not


def takes_gemv(m: int, w: torch.Tensor) -> bool:
    """Whether :func:`fp8_linear` of ``m`` rows on w [N, K], its tiles not named, runs
    :func:`gemv`: one row (:data:`GEMV_ROWS`), of 2-byte weights or at most
    :data:`GEMV_MAX_N` FP8 ones."""
    return m <= GEMV_ROWS and (w.shape[0] <= GEMV_MAX_N or w.element_size() > 1)


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
    glu: bool = False,
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
    one take the widening kernel at any row count. ``glu``: w is an MLP's gate_up (gate rows
    first) and the result is SiLU(gate) * up [..., N / 2]: inside gemv's launch where one row
    takes it and ``matvec.GEMV_GLU`` is set (the same bits), else by :func:`silu_mul` after."""
    n, k = w.shape
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    m = x2.shape[0]
    if blocks is None and takes_gemv(m, w) and (matvec.GEMV_GLU or not glu):
        y = gemv(x2, w, scale, bias, count, None, pdl, glu=glu)
        return y.view(*x.shape[:-1], y.shape[-1])
    if glu:
        return silu_mul(fp8_linear(x, w, scale, bias, count, blocks, pdl, round_rows), pdl)
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
    TMA: tl.constexpr,
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
    :func:`_split_k_finish` does (the row scales applied before, the column scales there).
    ``TMA``: q_ptr and w_ptr are tensor descriptors of [BLOCK_M, BLOCK_K] and [BLOCK_N, BLOCK_K]
    boxes, zero past the edges: the tiles come by the Tensor Memory Accelerator (Hopper), not
    by each thread's loads; the same tiles, so the same sums."""
    pid_n, pid_m, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rk = tl.arange(0, BLOCK_K)
    nm, mm = rn < N, rm < M
    k_lo = pid_k * k_per_split
    k_hi = tl.minimum(k_lo + k_per_split, K)
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)  # (out^T)
    if TMA:  # (a split's columns are whole BLOCK_K tiles but the last's, whose tail reads 0)
        _pdl_enter(PDL)
        for k0 in range(k_lo, k_hi, BLOCK_K):
            w = w_ptr.load([pid_n * BLOCK_N, k0])  # [BN, BK]
            q = q_ptr.load([pid_m * BLOCK_M, k0])  # [BM, BK]
            acc = tl.dot(w, tl.trans(q), acc, max_num_imprecise_acc=BLOCK_K)
    else:
        w_ptrs = w_ptr + rn[:, None].to(tl.int64) * K + (k_lo + rk)[None, :]  # [BN, BK]
        q_ptrs = q_ptr + rm[:, None].to(tl.int64) * K + (k_lo + rk)[None, :]  # [BM, BK]
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
    :func:`_split_rule`). ``count``: as :func:`fp8_linear`'s. ``pdl``: as
    :func:`add_rms_norm`'s (both launches). With :data:`FP8_MM_TMA`, the tiles are read by
    TMA where both sides' rows are whole 16 bytes (K a multiple of 16) and the GPU has TMA
    (:func:`tma_supported`: Hopper; Ada's FP8 keeps the threads' loads)."""
    m, k = x2.shape
    n = w.shape[0]
    q, xs = fp8_rows(x2, pdl)
    bm, bn, bk, warps, stages, split = (*blocks, 0)[:6] if blocks else fp8_mm_blocks(m, n, k)
    out = torch.empty(m, n, dtype=x2.dtype, device=x2.device)
    grid_n, grid_m = triton.cdiv(n, bn), triton.cdiv(m, bm)
    split = split or _split_rule(grid_n * grid_m, k)
    k_per_split, split, part, count = _split_k(out, k, split, bk, grid_n * grid_m, count)
    tma = FP8_MM_TMA and k % 16 == 0 and tma_supported(x2.device)
    q_in, w_in = (_descriptor(q, bm, bk), _descriptor(w, bn, bk)) if tma else (q, w)
    _fp8_mm_kernel[(grid_n, grid_m, split)](
        q_in,
        xs,
        w_in,
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
        TMA=tma,
        PDL=pdl,
        num_warps=warps,
        num_stages=stages,
        launch_pdl=pdl,
    )
    return out


def _descriptor(t: torch.Tensor, rows: int, cols: int):
    """A tensor descriptor of t [R, C] (contiguous, rows of whole 16 bytes) read in [rows, cols]
    boxes, zero past its edges: a TMA load's operand (built on the host; under a CUDA graph's
    capture its address is the graph's)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    return TensorDescriptor.from_tensor(t, [rows, cols])


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
FP8_MM_TMA = True  # ... its tiles read by TMA (tensor descriptors), not the threads' loads: 8B
# FP8 TPOT at 8 / 32 / 64 streams 3.20 / 3.57 / 4.17 -> 3.15 / 3.56 / 4.11 ms (H200, both of
# two rounds; docs/benchmarks.md 71)
FP8_SMS = 132  # an H100's SMs (an H200's too)
FP8_MMA_ROWS = 32  # above this many rows, bf16/fp16 inputs go to fp8_scaled_mm (Hopper, Ada)
LINEAR_ROWS = 16  # steps of at most this many rows may run bf16/fp16 Linears through fp8_linear


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
