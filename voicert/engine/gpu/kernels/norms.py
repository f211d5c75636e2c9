"""Residual add + RMSNorm (:func:`add_rms_norm`) and SiLU(gate) * up (:func:`silu_mul`). They
write a Linear's x, so for a one-row INT4 Linear they also lay that x out for its kernel (the
planes of int4_matmul.py) and save it a launch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from voicert.engine.gpu.kernels.common import _pdl_enter, _pow2
from voicert.engine.gpu.kernels.int4_matmul import _int4_a8_planes_put, _int4_planes_put

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
        enable_fp_fusion=False,  # x * rstd * w never an FMA into the planes' sums: fp32 planes
    )  # then equal int4_planes' of the stored output, bit for bit
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
        enable_fp_fusion=False,  # as add_rms_norm's: act * u never an FMA into the planes' sums
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
