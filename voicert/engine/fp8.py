"""FP8 (e4m3) weights with one scale per output channel: half the bytes of bf16 per decode step.

A decode step at small batch reads every weight once and does little else, so its time is the
weight bytes over the memory bandwidth; FP8 weights halve those bytes. :func:`quantize_fp8`
replaces every ``nn.Linear`` inside the model's layers (the q/k/v, output, gate/up and down
projections; the embedding and the LM head stay in the model's dtype, as vLLM's ``fp8`` does) by
an :class:`Fp8Linear`:

    w_fp8[n, k] = round_e4m3(w[n, k] / scale[n]),   scale[n] = max_k |w[n, k]| / 448

and computes ``y = (x @ w_fp8.T) * scale + bias``. On CUDA (``kernels.fp8_linear``): up to
``kernels.FP8_MMA_ROWS`` rows, and fp32 rows always, keep the activations in their dtype
(weight-only quantization, "W8A16": one Triton kernel widens the FP8 tiles in registers and sums
in fp32); more bf16/fp16 rows (prefill, wide batches) are rounded to e4m3 with a scale per row
and multiplied on the FP8 tensor cores. Elsewhere (the CPU, tests) the weights are widened in
full first: the same function as the W8A16 kernel, the fp32 sums in another order.

Quality is measured, not assumed: tests/engine/test_fp8.py checks top-1 agreement with the
unquantized model on the embedded SmolLM2's real weights, and ``python -m voicert.bench.engine
--fp8`` reports speed beside bf16.
"""

from __future__ import annotations

import torch
from torch import nn

E4M3_MAX = 448.0  # the largest finite float8_e4m3fn
FP8 = torch.float8_e4m3fn


def quantize_weight(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, K] (any float dtype) -> (FP8 weights [N, K], float32 scales [N]). A row of zeros
    gets scale 1 (its FP8 values are zeros either way)."""
    w = w.detach().float()
    amax = w.abs().amax(dim=1)  # [N]
    scale = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
    q = (w / scale[:, None]).clamp(-E4M3_MAX, E4M3_MAX).to(FP8)  # [N, K]
    return q, scale


class Fp8Linear(nn.Module):
    """A Linear layer over FP8 weights with per-output-channel float32 scales. Contract: input
    [..., K] in the model's dtype; output [..., N] in the input's dtype."""

    def __init__(self, weight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.register_buffer("weight", weight)  # [N, K] float8_e4m3fn
        self.register_buffer("scale", scale)  # [N] float32
        self.register_buffer("bias", bias)  # [N] in the model's dtype, or None
        self._count: torch.Tensor | None = None  # the split-K kernel's counters (CUDA)

    @classmethod
    def from_linear(cls, lin: nn.Linear) -> "Fp8Linear":
        q, scale = quantize_weight(lin.weight)
        bias = lin.bias.detach() if lin.bias is not None else None
        return cls(q, scale, bias)

    def dequantized(self, dtype: torch.dtype) -> torch.Tensor:
        """The weights this layer computes with, widened: [N, K] in ``dtype`` (via float32, so
        the product with the scale is rounded once)."""
        return (self.weight.float() * self.scale[:, None]).to(dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_cuda:
            from voicert.engine import kernels

            if self._count is None or self._count.device != x.device:
                self._count = kernels.counters(x.device)  # (each launch leaves them at zero)
            return kernels.fp8_linear(x, self.weight, self.scale, self.bias, self._count)
        y = torch.nn.functional.linear(x.float(), self.weight.float()) * self.scale  # [..., N]
        if self.bias is not None:
            y = y + self.bias.float()
        return y.to(x.dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, fp8_e4m3"


def quantize_fp8(model: nn.Module) -> int:
    """Replace, in place, every ``nn.Linear`` under ``model.layers`` by an :class:`Fp8Linear`;
    returns how many. The embedding and LM head keep the model's dtype. The model's memory drops
    by about half of its layers' weights (the originals are released)."""
    count = 0
    for layer in model.layers:
        for child in list(layer.modules()):
            for attr, sub in list(child.named_children()):
                if isinstance(sub, nn.Linear):
                    setattr(child, attr, Fp8Linear.from_linear(sub))
                    count += 1
    return count
