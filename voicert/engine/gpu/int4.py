"""INT4 weights, group-wise scales and offsets ("W4A16"): a quarter of bf16's bytes per step.

A decode step at small batch streams every weight once, so its time is the weight bytes over the
memory bandwidth; 4-bit weights cut them to ~0.27 of bf16's (the scales and offsets included).
:func:`quantize_int4` replaces every ``nn.Linear`` inside the model's layers (q/k/v, output,
gate/up, down; the embedding and LM head keep the model's dtype, as GPTQ and AWQ checkpoints do)
by an :class:`Int4Linear`. For each output row n and each group of ``group`` input columns
(``llm.int4_group``: 128, 64 or 32; half that where K is not a multiple of it: SmolLM2-135M's 576
in 64s at the default), a float16 scale and a float16 low (the group's least value):

    w'[n, k] = code[n, k] * scale[n, g] + low[n, g]        (code an integer in [0, 15])

computed in float32 (the product is exact there, the sum rounded once). That is the grid of
llama.cpp's 4-bit formats (Q4_1, and Q4_K's sub-blocks of 32): such a file's layers load with
no rounding of their own but the float16 of Q4_K's two-level scales (engine/gpu/gguf.py). AWQ's
``(code - zero) * scale`` with an integer zero is ``low = -zero * scale`` (rounded to float16:
at most 2^-12 of it; ``round(-low / scale)`` gives the zero back exactly). Quantizing here
(:func:`grid`) takes each group's own [min, max]: ``low = min``, ``scale = (max - min) / 15``.

Two codes share a byte: within a group, byte j holds column j (low nibble) and column j +
group / 2 (high nibble). ``llm.int4_rounding`` (like FP8's): ``gptq`` chooses each code with
GPTQ's error feedback against the calibration set (engine/gpu/fp8.py: the groups are fixed from
the weights before the rounding, "static groups", so the kernel needs no column order);
``nearest`` takes the nearest code.

On CUDA (``kernels.int4_linear``) a Triton kernel reads the packed bytes, widens the codes
(small integers, exact in bf16) in registers, sums each group's products in fp32 on the tensor
cores and applies the group's scale and low once (``scale * sum(x * code) + low * sum(x)``); at
more rows each weight is widened whole, in registers or into a scratch for cuBLAS
(``kernels.int4_path`` chooses). Elsewhere (the CPU, tests) the weights are widened in full first
(:meth:`Int4Linear.dequantized`): the same function, the sums in another order.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from voicert.engine.gpu.fp8 import (
    MOMENT_BYTES,
    Grid,
    _by_shape,
    _groups,
    _layer_linears,
    gptq_round,
    input_moments,
    quantize_head,
)

LEVELS = 15  # the largest code: four bits
HALF_MIN = 2.0**-14  # float16's smallest normal number: the least scale stored


GROUPS = (128, 64, 32)  # the group sizes ``llm.int4_group`` may name


def group_size(k: int, want: int = 128) -> int | None:
    """The columns a scale covers for an input width ``k``: ``want`` (one of :data:`GROUPS`), or
    half of it (at least 32) where ``want`` does not divide ``k``; None where neither does (such
    a layer keeps its weights)."""
    for g in (want, want // 2):
        if g >= GROUPS[-1] and k % g == 0:
            return g
    return None


def _params(
    w: torch.Tensor, group: int, integer_zero: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """w [L, N, K] float32 -> (scale, low), each [L, N, K // group] float32 holding float16
    values as stored: low the group's least value, scale its range over 15. ``integer_zero``:
    AWQ's grid instead, the range widened to hold 0 and low = -zero * scale for an integer zero
    in [0, 15], so that 0 is on the grid and the layer exports to AWQ (engine/gpu/awq.py)."""
    lead = w.shape[:-1]
    wg = w.reshape(*lead, -1, group)  # [L, N, G, group]
    lo, hi = wg.amin(dim=-1), wg.amax(dim=-1)
    if integer_zero:
        lo, hi = lo.clamp(max=0.0), hi.clamp(min=0.0)
        scale = ((hi - lo) / LEVELS).clamp(min=HALF_MIN).half().float()
        zero = (-lo / scale).round().clamp(0, LEVELS)
        return scale, (-zero * scale).half().float()
    low = lo.half().float()
    return ((hi - low) / LEVELS).clamp(min=HALF_MIN).half().float(), low


def _code_of(col: torch.Tensor, scale: torch.Tensor, low: torch.Tensor) -> torch.Tensor:
    """The nearest code (float32, an integer in [0, 15]) of each value on its grid."""
    return ((col - low) / scale).round().clamp(0, LEVELS)


def _put(col: torch.Tensor, scale: torch.Tensor, low: torch.Tensor) -> torch.Tensor:
    """A column's values on the grid: code * scale + low, in float32 (as the kernels widen)."""
    return _code_of(col, scale, low) * scale + low


def grid(group: int, integer_zero: bool = False) -> Grid:
    """GPTQ's view of the INT4 grid with groups of ``group`` columns (``integer_zero``: as
    :func:`_params`)."""
    name = f"int4/{group}" + ("/zero" if integer_zero else "")
    return Grid(name, group, lambda w: _params(w, group, integer_zero), _put)


def pack(codes: torch.Tensor, group: int) -> torch.Tensor:
    """codes [N, K] (integers in [0, 15], any dtype; K a multiple of ``group``) -> uint8
    [N, K // 2]: within each group, byte j holds column j in its low nibble and column j +
    group / 2 in its high one (so a kernel's two halves of a group are each contiguous)."""
    n, k = codes.shape
    c = codes.to(torch.uint8).reshape(n, k // group, 2, group // 2)  # [N, G, half, group / 2]
    return (c[:, :, 0] | (c[:, :, 1] << 4)).reshape(n, k // 2)


def unpack(packed: torch.Tensor, group: int) -> torch.Tensor:
    """uint8 [N, K // 2] -> codes uint8 [N, K] (the inverse of :func:`pack`)."""
    n, half = packed.shape
    p = packed.reshape(n, -1, 1, group // 2)  # [N, G, 1, group / 2]
    return torch.cat((p & 15, p >> 4), dim=2).reshape(n, 2 * half)


def _per_column(
    scale: torch.Tensor, low: torch.Tensor, group: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """A group's scale and low [N, G] -> each column's [N, K] (float32)."""
    return (
        scale.float().repeat_interleave(group, dim=1),
        low.float().repeat_interleave(group, dim=1),
    )


def _codes(q: torch.Tensor, scale: torch.Tensor, low: torch.Tensor, group: int) -> torch.Tensor:
    """Values q [N, K] (on the grid, or any: the nearest code) with their groups' scale and low
    [N, G] -> codes [N, K] uint8."""
    return _code_of(q, *_per_column(scale, low, group)).to(torch.uint8)


class Int4Linear(nn.Module):
    """A Linear layer over packed INT4 weights with a float16 scale and low per output row and
    group of input columns. Contract: input [..., K] in the model's dtype (K a multiple
    of ``group``); output [..., N] in the input's dtype."""

    def __init__(
        self,
        packed: torch.Tensor,
        scale: torch.Tensor,
        low: torch.Tensor,
        bias: torch.Tensor | None,
    ) -> None:
        super().__init__()
        self.out_features, half = packed.shape
        self.in_features = 2 * half
        self.group = self.in_features // scale.shape[1]
        self.register_buffer("weight", packed)  # [N, K // 2] uint8
        self.register_buffer("scale", scale)  # [N, K // group] float16
        self.register_buffer("low", low)  # [N, K // group] float16
        self.register_buffer("bias", bias)  # [N] in the model's dtype, or None
        self._count: torch.Tensor | None = None  # the split-K kernel's counters (CUDA)
        self.a8 = False  # llm.int4_activations int8: one-row steps round x (W4A8, a8_rounds)

    @classmethod
    def from_linear(
        cls,
        lin: nn.Linear,
        rounded: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
        want: int = 128,
        integer_zero: bool = False,
    ) -> Int4Linear:
        """``lin`` over INT4 weights: ``rounded`` (values on the grid [N, K] float32; scale and
        low [N, G], from :func:`gptq_round` on :func:`grid`), or its weights rounded to the
        nearest code of :func:`_params`'s grid (``integer_zero``: AWQ's). Its ``in_features``
        must have a :func:`group_size` for ``want``."""
        group = group_size(lin.in_features, want)
        if group is None:
            raise ValueError(f"int4: no group size divides in_features={lin.in_features}")
        bias = lin.bias.detach() if lin.bias is not None else None
        if rounded is None:
            codes, scale, low = nearest(lin.weight.detach(), group, integer_zero)
        else:
            q, scale, low = rounded
            codes = _codes(q, scale, low, group)
        return cls(pack(codes, group), scale.half(), low.half(), bias)

    def _apply(self, fn, recurse: bool = True):
        """As nn.Module's, but a model-wide ``.to(dtype)`` leaves the scales and lows in float16
        (their stored format; the kernels read them so): only their device follows."""
        scale, low = self.scale, self.low
        super()._apply(fn, recurse)
        if self.scale.dtype != scale.dtype:
            self.scale = scale.to(self.scale.device)
        if self.low.dtype != low.dtype:
            self.low = low.to(self.low.device)
        return self

    def dequantized(self, dtype: torch.dtype) -> torch.Tensor:
        """The weights this layer computes with, widened: [N, K] in ``dtype`` (via float32: the
        product with the scale is exact, the sum with the low rounded once)."""
        codes = unpack(self.weight, self.group).float()
        s, low = _per_column(self.scale, self.low, self.group)
        return (codes * s + low).to(dtype)

    def forward(
        self, x: torch.Tensor, pdl: bool = False, planes: torch.Tensor | None = None
    ) -> torch.Tensor:
        """x [..., K] -> [..., N] in x's dtype. ``pdl`` (CUDA, Hopper+): launch the kernel with
        programmatic dependent launch (engine/gpu/kernels/common.py). ``planes``: one row's x laid
        out for the one-row kernel already (``kernels.int4_planes``' values, or with ``a8``
        ``kernels.int4_a8_planes``'; CUDA only). With ``a8``, a row that :func:`a8_rounds`
        is rounded to int8 by group first, here as on the GPU (:func:`int8_groups`)."""
        a8 = self.a8 and a8_rounds(x.numel() // x.shape[-1], x.dtype)
        if x.is_cuda:
            from voicert.engine.gpu import kernels

            if self._count is None or self._count.device != x.device:
                self._count = kernels.counters(x.device)  # (each launch leaves them at zero)
            return kernels.int4_linear(
                x, self.weight, self.scale, self.low, self.bias, self._count, pdl=pdl,
                planes=planes, a8=a8,
            )  # fmt: skip
        xs = int8_groups(x, self.group) if a8 else x.float()
        y = torch.nn.functional.linear(xs, self.dequantized(torch.float32))  # [..., N]
        if self.bias is not None:
            y = y + self.bias.float()
        return y.to(x.dtype)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"int4, group={self.group}{', a8' if self.a8 else ''}"
        )


def a8_rounds(rows: int, dtype: torch.dtype) -> bool:
    """Whether an Int4Linear with ``a8`` (``llm.int4_activations: int8``) rounds x of ``rows``
    rows to int8: one row (a decode step of one stream; ``kernels.int4_gemv_a8``) of bf16 or
    fp16. Steps of more rows and fp32 rows (the exactness tests') keep x as it is."""
    return rows == 1 and dtype in (torch.bfloat16, torch.float16)


def int8_groups(x: torch.Tensor, group: int) -> torch.Tensor:
    """x [..., K] rounded as ``kernels.int4_gemv_a8`` rounds it, in float32: each group of
    ``group`` columns to int8 codes with a scale (its largest magnitude maps to 127, a group of
    zeros stays zero; ``floor(v / scale + 0.5)``), times that scale."""
    g = x.float().reshape(-1, group)  # [rows * groups, group]
    sx = g.abs().amax(1, keepdim=True).clamp(min=1e-30) / 127.0
    return (torch.floor(g / sx + 0.5) * sx).reshape(x.shape)


def set_activations(model: nn.Module, int8: bool) -> int:
    """``llm.int4_activations``: every Int4Linear of ``model`` rounds its one-row x to int8
    (``int8``; :func:`a8_rounds`) or not. How many layers it set."""
    layers = [m for m in model.modules() if isinstance(m, Int4Linear)]
    for lin in layers:
        lin.a8 = int8
    return len(layers)


def nearest(
    w: torch.Tensor, group: int, integer_zero: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Weights w [N, K] (K a multiple of ``group``) rounded to the nearest code of
    :func:`_params`'s grid -> (codes uint8 [N, K], scale, low [N, K // group] float32 holding
    float16 values)."""
    w = w.detach().float()
    scale, low = _params(w[None], group, integer_zero)  # [1, N, G]
    return _codes(w, scale[0], low[0], group), scale[0], low[0]


def quantize_int4(
    model: nn.Module,
    calibrate: Callable[[], None] | None = None,
    moment_bytes: int = MOMENT_BYTES,
    group: int = 128,
    head: bool = False,
    integer_zero: bool = False,
) -> int:
    """Replace, in place, every ``nn.Linear`` under ``model.layers`` whose input width has a
    :func:`group_size` for ``group`` (one of :data:`GROUPS`) by an :class:`Int4Linear`; returns
    how many. ``calibrate``: as :func:`voicert.engine.gpu.fp8.quantize_fp8`'s (GPTQ against those
    inputs; None: nearest rounding). The embedding keeps the model's dtype, and so does the LM
    head unless ``head`` (then to nearest: ``fp8.quantize_head``). ``integer_zero``: AWQ's grid
    (:func:`_params`), for a model to export as AWQ."""
    if group not in GROUPS:
        raise ValueError(f"int4: group {group} is not one of {GROUPS}")
    layers = _layer_linears(model)
    rounded: dict[nn.Linear, Int4Linear] = {}  # packed as soon as rounded: fp32 values of every
    # layer would be a second fp32 copy of the model (a 1.5B model ran out of 24 GB so)
    graphs: dict = {}
    for part in _groups(layers, moment_bytes) if calibrate is not None else []:
        fits = [lin for lin in part if group_size(lin.in_features, group) is not None]
        moments = input_moments(fits, calibrate)
        for same in _by_shape(fits):
            g = group_size(same[0].in_features, group)
            assert g is not None
            q, scale, low = gptq_round(
                [lin.weight for lin in same],
                [moments.pop(lin) for lin in same],
                grid(g, integer_zero),
                graphs=graphs,
            )
            for j, lin in enumerate(same):
                rounded[lin] = Int4Linear.from_linear(lin, (q[j], scale[j], low[j]), group)
            del q
    count = 0
    for layer in layers:
        for child, attr, lin in layer:
            if group_size(lin.in_features, group) is None:
                continue
            q4 = rounded.pop(lin, None) or Int4Linear.from_linear(lin, None, group, integer_zero)
            setattr(child, attr, q4)
            count += 1
    if head:
        count += quantize_head(
            model, lambda lin: Int4Linear.from_linear(lin, None, group, integer_zero)
        )
    return count
