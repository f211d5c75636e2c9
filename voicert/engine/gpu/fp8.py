"""FP8 (e4m3) weights with one scale per output channel: half the bytes of bf16 per decode step.

A decode step at small batch reads every weight once and does little else, so its time is the
weight bytes over the memory bandwidth; FP8 weights halve those bytes. :func:`quantize_fp8`
replaces every ``nn.Linear`` inside the model's layers (the q/k/v, output, gate/up and down
projections; the embedding and the LM head stay in the model's dtype, as vLLM's ``fp8`` does) by
an :class:`Fp8Linear`:

    w_fp8[n, k] = round_e4m3(w[n, k] / scale[n]),   scale[n] = max_k |w[n, k]| / 448

and computes ``y = (x @ w_fp8.T) * scale + bias``. On CUDA (``kernels.fp8_linear``): one row,
and fp32 rows always, keep the activations in their dtype (weight-only quantization, "W8A16":
the weights widened in registers, fp32 sums); bf16/fp16 steps of 2 to
``kernels.fp8_matmul.FP8_MM_ROWS`` rows (``kernels.fp8_mm``), and more (prefill, wide
batches; where K and N are multiples of 16), are rounded to e4m3 with a scale per row and
multiplied on the FP8 tensor cores, unless ``llm.fp8_activations: model`` keeps them (``Fp8Linear.round_rows``: the widening
kernel at every row count). Elsewhere (the CPU, tests) the weights are widened in full first:
the same function as the W8A16 kernel, the fp32 sums in another order.

How each weight is rounded (``llm.rounding``):

- ``nearest``: each weight to its nearest e4m3 value;
- ``gptq`` (the default): error-compensated rounding (GPTQ, Frantar et al. 2022) onto the same
  grid with the same scales. The unquantized model's forward over a calibration text set
  (``data/fp8_calibration.json``, each text a row of its own, so no padding enters;
  engine/core/calibration.py) gives each
  Linear the second moment of its inputs, H = E[x x^T] [K, K] (as many layers' at a time as fit
  in ``MOMENT_BYTES``: one forward per such group). The columns are then rounded one at a time,
  largest H[k, k] first, and each column's rounding error is spread over the columns not yet
  rounded, weighted by H^-1, so that the layer's *output* on such inputs stays close. The
  Linears of one shape are rounded as one stack; on a GPU each block of columns replays a CUDA
  graph. The format and the kernels are unchanged: only which e4m3 value each weight takes.

Quality is measured, not assumed: tests/engine/test_fp8.py checks top-1 agreement with the
unquantized model on the embedded SmolLM2's real weights, and ``python -m voicert.bench.engine
--fp8`` reports speed beside bf16.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from voicert.engine.gpu.formats import E4M3_MAX

FP8 = torch.float8_e4m3fn


def quantize_weight(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, K] (any float dtype) -> (FP8 weights [N, K], float32 scales [N]). A row of zeros
    gets scale 1 (its FP8 values are zeros either way)."""
    w = w.detach().float()
    amax = w.abs().amax(dim=1)  # [N]
    scale = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
    q = (w / scale[:, None]).clamp(-E4M3_MAX, E4M3_MAX).to(FP8)  # [N, K]
    return q, scale


def _to_grid(w: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """w and scale (float32, broadcastable) -> w / scale rounded to e4m3, times scale."""
    return (w / scale).clamp(-E4M3_MAX, E4M3_MAX).to(FP8).float() * scale


@dataclass(frozen=True)
class Grid:
    """The values GPTQ may round a weight to. ``params(w)``: w [L, N, K] float32 -> (scale,
    zero), each [L, N, K // group] float32 (``group`` None: one group of all K columns); ``put(col,
    scale, zero)``: a column [L, N] and its group's parameters -> the column's values on the grid
    (float32, times the scale). ``name`` keys the CUDA graphs of :func:`gptq_round`."""

    name: str
    group: int | None
    params: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
    put: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def _fp8_params(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    amax = w.abs().amax(dim=2, keepdim=True)  # [L, N, 1]
    scale = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
    return scale, torch.zeros_like(scale)


FP8_GRID = Grid("fp8", None, _fp8_params, lambda col, scale, _zero: _to_grid(col, scale))


def _round_block(
    wb: torch.Tensor,
    hb: torch.Tensor,
    scale: torch.Tensor,
    zero: torch.Tensor,
    q: torch.Tensor,
    errs: torch.Tensor,
    grid: Grid = FP8_GRID,
) -> None:
    """GPTQ within one block of B columns of L stacked weights, in place, columns as rows (so
    each one is contiguous): wb [L, B, N] float32 (the block's weights, updated as columns are
    rounded), hb [L, B, B] (their parts of the upper Cholesky factors of H^-1), scale and zero
    [L, B, N] (each column's grid parameters) -> q [L, B, N] (the values on the grid, times the
    scale), errs [L, B, N] (each column's scaled error, for the columns after the block)."""
    for i in range(wb.shape[1]):
        col = wb[:, i]  # [L, N]
        q[:, i] = grid.put(col, scale[:, i], zero[:, i])
        errs[:, i] = (col - q[:, i]) / hb[:, i, i, None]
        wb[:, i:] -= hb[:, i, i:, None] * errs[:, i, None]


class _BlockGraph:
    """:func:`_round_block` for one shape and grid on a GPU, captured once as a CUDA graph over
    static buffers and replayed per block: the loop is ~5 small launches per column, which
    eagerly cost more host time than GPU time (docs/benchmarks.md 29)."""

    def __init__(
        self, shape: tuple[int, int, int], device: torch.device, grid: Grid = FP8_GRID
    ) -> None:
        stack, block, n = shape
        self.wb = torch.zeros(stack, block, n, device=device)
        self.hb = torch.eye(block, device=device).repeat(stack, 1, 1)
        self.scale = torch.ones(stack, block, n, device=device)
        self.zero = torch.zeros(stack, block, n, device=device)
        self.q = torch.zeros_like(self.wb)
        self.errs = torch.zeros_like(self.wb)
        args = (self.hb, self.scale, self.zero, self.q, self.errs, grid)
        stream = torch.cuda.Stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):  # warm-up outside the capture, as CUDA graphs ask
            _round_block(self.wb.clone(), *args)
        torch.cuda.current_stream(device).wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            _round_block(self.wb, *args)

    def __call__(self, wb, hb, scale, zero, q, errs, _grid=None) -> None:
        self.wb.copy_(wb)
        self.hb.copy_(hb)
        self.scale.copy_(scale)
        self.zero.copy_(zero)
        self.graph.replay()
        wb.copy_(self.wb)
        q.copy_(self.q)
        errs.copy_(self.errs)


def _inverse_factor(h: torch.Tensor, damp: float) -> torch.Tensor:
    """h [K, K] (float32, already permuted) -> the upper Cholesky factor of (h + damp * mean
    diagonal * I)^-1 [K, K]."""
    h = h + damp * torch.diag(h).mean() * torch.eye(h.shape[0], device=h.device)
    return torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)), upper=True)


def gptq_round(
    ws: list[torch.Tensor],
    hessians: list[torch.Tensor],
    grid: Grid,
    damp: float = 0.01,
    block: int = 32,
    graphs: dict | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """GPTQ rounding of L weights of one shape together onto ``grid``. ws: L x [N, K] (any float
    dtype); hessians: L x [K, K] (E[x x^T] of each one's inputs) -> (q [L, N, K] float32: the
    values on the grid, times the scale; scale and zero [L, N, G]: ``grid.params`` of the
    weights as given, so the groups are those of the original column order). Columns are
    rounded by descending H[k, k], ``damp`` times the mean diagonal added to H, the error
    feedback applied within blocks of ``block`` columns, then to the rest at once. Each weight's
    result is that of rounding it alone; stacking shares the loop's per-column launches. Runs on
    the weights' device; on a GPU each block's loop replays a CUDA graph, kept in ``graphs`` (a
    dict the caller may share between calls) by shape and grid."""
    w = torch.stack([x.detach().float() for x in ws])  # [L, N, K]
    stack, n, k = w.shape
    group = grid.group or k
    scale, zero = grid.params(w)  # [L, N, G]
    orders = []
    hinv = torch.empty(stack, k, k, device=w.device)  # [L, K, K]
    for j, hessian in enumerate(hessians):
        h = hessian.to(w.device, torch.float32).clone()  # [K, K]
        dead = torch.diag(h) == 0  # inputs that were always zero: their weights do not matter
        h[dead, dead] = 1.0
        w[j][:, dead] = 0.0
        order = torch.argsort(torch.diag(h), descending=True)  # [K]
        w[j] = w[j][:, order]
        hinv[j] = _inverse_factor(h[order][:, order], damp)
        orders.append(order)
    groups = torch.stack(orders) // group  # [L, K]: each permuted column's group
    q = torch.empty_like(w)  # [L, N, K] rounded values (times the scale), in each ``order``
    graphs = {} if graphs is None else graphs
    for a in range(0, k, block):
        b = min(a + block, k)
        round_block: Callable[..., None] = _round_block
        if w.is_cuda:
            key = (stack, b - a, n, w.device, grid.name)
            round_block = graphs[key] = graphs.get(key) or _BlockGraph(key[:3], w.device, grid)
        at = groups[:, None, a:b].expand(stack, n, b - a)  # [L, N, B]
        sb = scale.gather(2, at).transpose(1, 2).contiguous()  # [L, B, N]
        zb = zero.gather(2, at).transpose(1, 2).contiguous()
        wb = w[:, :, a:b].transpose(1, 2).contiguous()  # [L, B, N]
        qb, errs = torch.empty_like(wb), torch.empty_like(wb)
        round_block(wb, hinv[:, a:b, a:b].contiguous(), sb, zb, qb, errs, grid)
        q[:, :, a:b] = qb.transpose(1, 2)
        w[:, :, b:] -= torch.bmm(errs.transpose(1, 2), hinv[:, a:b, b:])
    for j, order in enumerate(orders):
        q[j] = q[j][:, torch.argsort(order)]
    return q, scale, zero


def gptq_weights(
    ws: list[torch.Tensor],
    hessians: list[torch.Tensor],
    damp: float = 0.01,
    block: int = 32,
    graphs: dict | None = None,
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """:func:`gptq_round` onto FP8's grid -> L x (FP8 weights [N, K], float32 scales [N]): the
    scales of :func:`quantize_weight`, the values chosen by GPTQ."""
    q, scale, _ = gptq_round(ws, hessians, FP8_GRID, damp, block, graphs)
    out = []
    for qj, sj in zip(q, scale[:, :, 0]):
        out.append(((qj / sj[:, None]).clamp(-E4M3_MAX, E4M3_MAX).to(FP8), sj))
    return out


def gptq_weight(
    w: torch.Tensor,
    hessian: torch.Tensor,
    damp: float = 0.01,
    block: int = 32,
    graphs: dict | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`gptq_weights` of one weight w [N, K] with the moments of its inputs [K, K]."""
    return gptq_weights([w], [hessian], damp, block, graphs)[0]


def input_moments(
    linears: list[nn.Linear], forward: Callable[[], None]
) -> dict[nn.Linear, torch.Tensor]:
    """E[x x^T] [K, K] (float32) of the inputs of each of ``linears``, over every token that
    ``forward()`` feeds the model they belong to (inference tensors when ``forward`` runs under
    ``torch.inference_mode``, as the engine's runner does: read them without autograd)."""
    sums: dict[nn.Linear, torch.Tensor] = {}
    counts: dict[nn.Linear, int] = {}

    def hook(mod: nn.Linear, inputs: tuple[torch.Tensor, ...], _out: torch.Tensor) -> None:
        x = inputs[0].detach().reshape(-1, mod.in_features).float()  # [T, K]
        if mod not in sums:
            sums[mod] = torch.zeros(mod.in_features, mod.in_features, device=x.device)
            counts[mod] = 0
        sums[mod].addmm_(x.T, x)
        counts[mod] += x.shape[0]

    handles = [m.register_forward_hook(hook) for m in linears]
    try:
        forward()
    finally:
        for h in handles:
            h.remove()
    with torch.inference_mode():  # (the sums are inference tensors: made under the forward's)
        return {m: sums[m].div_(counts[m]) for m in sums}  # in place: no second copy of each


class Fp8Linear(nn.Module):
    """A Linear layer over FP8 weights with per-output-channel float32 scales. Contract: input
    [..., K] in the model's dtype; output [..., N] in the input's dtype."""

    def __init__(
        self, weight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None
    ) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.register_buffer("weight", weight)  # [N, K] float8_e4m3fn
        self.register_buffer("scale", scale)  # [N] float32
        self.register_buffer("bias", bias)  # [N] in the model's dtype, or None
        self._count: torch.Tensor | None = None  # the split-K kernel's counters (CUDA)
        self.round_rows = True  # llm.fp8_activations fp8: steps of several rows round x (W8A8)

    @classmethod
    def from_linear(
        cls, lin: nn.Linear, rounded: tuple[torch.Tensor, torch.Tensor] | None = None
    ) -> Fp8Linear:
        """``lin`` over FP8 weights: ``rounded`` (FP8 weights [N, K], scales [N], e.g. from
        :func:`gptq_weights`), or its weights rounded to the nearest e4m3 values."""
        q, scale = rounded or quantize_weight(lin.weight)
        bias = lin.bias.detach() if lin.bias is not None else None
        return cls(q, scale, bias)

    def dequantized(self, dtype: torch.dtype) -> torch.Tensor:
        """The weights this layer computes with, widened: [N, K] in ``dtype`` (via float32, so
        the product with the scale is rounded once)."""
        return (self.weight.float() * self.scale[:, None]).to(dtype)

    def forward(self, x: torch.Tensor, pdl: bool = False, glu: bool = False) -> torch.Tensor:
        """x [..., K] -> [..., N] in x's dtype. ``pdl`` (CUDA, Hopper+): launch the kernel with
        programmatic dependent launch (engine/gpu/kernels/common.py). ``glu``: this is an MLP's
        gate_up (gate rows first) and the result is SiLU(gate) * up [..., N / 2]
        (``kernels.fp8_linear``'s ``glu``)."""
        if x.is_cuda:
            from voicert.engine.gpu import kernels

            if self._count is None or self._count.device != x.device:
                self._count = kernels.counters(x.device)  # (each launch leaves them at zero)
            return kernels.fp8_linear(
                x, self.weight, self.scale, self.bias, self._count, pdl=pdl,
                round_rows=self.round_rows, glu=glu,
            )  # fmt: skip
        y = torch.nn.functional.linear(x.float(), self.weight.float()) * self.scale  # [..., N]
        if self.bias is not None:
            y = y + self.bias.float()
        y = y.to(x.dtype)
        if not glu:
            return y
        from voicert.engine.gpu import kernels  # (the fused path, in the kernels' interpreter)

        return kernels.silu_mul(y)  # silu_mul's roundings, as on CUDA

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, fp8_e4m3"


MOMENT_BYTES = 4 << 30  # GPTQ: the input moments held at once (4 GiB: 4 of an 8B model's layers)
STACK_BYTES = 1 << 30  # GPTQ: work memory of the weights rounded together in one stack


def _layer_linears(model: nn.Module) -> list[list[tuple[nn.Module, str, nn.Linear]]]:
    """Per layer of ``model.layers``: (parent, attribute, Linear) of each Linear in it."""
    return [
        [
            (child, attr, sub)
            for child in layer.modules()
            for attr, sub in child.named_children()
            if isinstance(sub, nn.Linear)
        ]
        for layer in model.layers
    ]


def _groups(
    layers: list[list[tuple[nn.Module, str, nn.Linear]]], budget: int
) -> list[list[nn.Linear]]:
    """Consecutive layers' Linears, in groups whose input moments (K x K float32 each) fit in
    ``budget`` bytes (at least one layer a group); none for layers with no Linears left (a
    GGUF model's layers imported as they are, engine/gpu/gguf.py)."""
    groups: list[list[nn.Linear]] = []
    used = budget
    for layer in (layer for layer in layers if layer):
        size = sum(4 * lin.in_features**2 for _, _, lin in layer)
        if used + size > budget:
            groups.append([])
            used = 0
        groups[-1].extend(lin for _, _, lin in layer)
        used += size
    return groups


def _by_shape(linears: list[nn.Linear], budget: int = STACK_BYTES) -> list[list[nn.Linear]]:
    """``linears`` in stacks of one weight shape each, as many as fit in ``budget`` bytes of
    GPTQ's float32 work memory (~3 copies of the weights [N, K], 2 of H [K, K] each; at least
    one a stack), in order of first appearance."""
    shapes: dict[tuple[int, ...], list[nn.Linear]] = {}
    for lin in linears:
        shapes.setdefault(tuple(lin.weight.shape), []).append(lin)
    stacks = []
    for same in shapes.values():
        n, k = same[0].weight.shape
        per = max(1, budget // (4 * (3 * n * k + 2 * k * k)))
        stacks.extend(same[i : i + per] for i in range(0, len(same), per))
    return stacks


def quantize_fp8(
    model: nn.Module,
    calibrate: Callable[[], None] | None = None,
    moment_bytes: int = MOMENT_BYTES,
    head: bool = False,
) -> int:
    """Replace, in place, every ``nn.Linear`` under ``model.layers`` by an :class:`Fp8Linear`;
    returns how many. ``calibrate``: a function that runs the (unquantized) model forward over
    calibration text (see ``engine/core/calibration.py``); given, the weights are rounded with GPTQ
    against those inputs, else to the nearest e4m3 value. With GPTQ the moments of as many
    layers as fit in ``moment_bytes`` are gathered per forward; every layer is replaced only
    after the last forward, so each layer's moments come from the unquantized model whatever
    the grouping. The embedding keeps the model's dtype, and so does the LM head unless
    ``head`` (then it is rounded to nearest: see :func:`quantize_head`). The model's memory drops
    by about half of its layers' weights (the originals are released)."""
    layers = _layer_linears(model)
    rounded: dict[nn.Linear, tuple[torch.Tensor, torch.Tensor]] = {}
    graphs: dict = {}
    for group in _groups(layers, moment_bytes) if calibrate is not None else []:
        moments = input_moments(group, calibrate)
        for same in _by_shape(group):  # e.g. every layer's qkv of the group, rounded together
            results = gptq_weights(
                [lin.weight for lin in same], [moments.pop(lin) for lin in same], graphs=graphs
            )
            rounded.update(zip(same, results))
    count = 0
    for layer in layers:
        for child, attr, lin in layer:
            setattr(child, attr, Fp8Linear.from_linear(lin, rounded.pop(lin, None)))
            count += 1
    if head:
        count += quantize_head(model, Fp8Linear.from_linear)
    return count


def set_activations(model: nn.Module, fp8: bool) -> int:
    """``llm.fp8_activations``: every Fp8Linear of ``model`` rounds the rows of a step of
    several rows to FP8 on the GPU (``fp8``: W8A8, kernels.fp8_mm and fp8_scaled_mm) or keeps
    them in the model's dtype (W8A16, the widening kernel). How many layers it set."""
    layers = [m for m in model.modules() if isinstance(m, Fp8Linear)]
    for lin in layers:
        lin.round_rows = fp8
    return len(layers)


def quantize_head(model: nn.Module, make: Callable[[nn.Linear], nn.Module]) -> int:
    """Replace ``model.lm_head`` (an ``nn.Linear``) by ``make(lm_head)``, its weights rounded to
    nearest (GPTQ would need the head's input moments, and a calibration forward passes it one
    token a row); returns 1, or 0 where ``make`` refuses the shape (ValueError). A tied
    embedding keeps its weights in the model's dtype."""
    lin = model.lm_head
    assert isinstance(lin, nn.Linear), "the LM head is quantized once"
    try:
        model.lm_head = make(lin)
    except ValueError:
        return 0
    return 1
