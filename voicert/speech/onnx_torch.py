"""A quantized ONNX graph (QDQ form) run by torch, on any device, batched.

smart-turn v3 ships as an int8 QDQ ONNX file (a Whisper-tiny encoder and a small head):
QuantizeLinear / DequantizeLinear pairs around float ops. onnxruntime runs it on the CPU; on a
GPU box its CUDA provider would need PyPI's onnxruntime-gpu, which is built for CUDA 12 (the GPU
machines have CUDA 13 only), and onnx2torch has no QDQ converters. So this interprets the graph
with torch ops, node by node: weights are dequantized once at load, and activations keep their
QDQ rounding (quantize to the stored scale and zero point, clamp, dequantize), so the numbers are
the quantized model's, not a float re-derivation of it. onnxruntime fuses the same pairs into
integer kernels; the two agree to rounding (tests/speech/test_onnx_torch.py).

Only the operators the smart-turn graphs use are implemented; another graph with other operators
is refused at load, naming them.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F

Op = Callable[..., torch.Tensor]


def _qrange(dtype: torch.dtype) -> tuple[int, int]:
    return (0, 255) if dtype == torch.uint8 else (-128, 127)


def _bcast(t: torch.Tensor, x: torch.Tensor, axis: int | None) -> torch.Tensor:
    """A per-axis scale or zero point [C] shaped to broadcast over ``x`` along ``axis``."""
    if t.numel() == 1 or axis is None:
        return t.reshape(())
    shape = [1] * x.dim()
    shape[axis] = -1
    return t.reshape(shape)


def quantize(x, scale, zero, axis=1):
    """ONNX QuantizeLinear: round half to even, saturate to the zero point's type. The result
    stays a float tensor holding the integers (what DequantizeLinear reads back)."""
    lo, hi = _qrange(zero.dtype)
    s, z = _bcast(scale, x, axis), _bcast(zero, x, axis)
    return torch.clamp(torch.round(x / s) + z.to(x.dtype), lo, hi)


def dequantize(q, scale, zero, axis=1):
    """ONNX DequantizeLinear: (q - zero point) * scale, per tensor or per ``axis``."""
    s, z = _bcast(scale, q, axis), _bcast(zero, q, axis)
    return (q.to(s.dtype) - z.to(s.dtype)) * s


def _conv(x, w, b=None, pads=(0, 0), strides=(1,), dilations=(1,), group=1, **_):
    assert pads[0] == pads[-1], "asymmetric padding"
    return F.conv1d(x, w, b, strides[0], pads[0], dilations[0], group)


def _gemm(a, b, c=None, alpha=1.0, beta=1.0, transA=0, transB=0):
    a = a.T if transA else a
    b = b.T if transB else b
    out = alpha * (a @ b)
    return out if c is None else out + beta * c


def _reshape(x, shape, allowzero=0):
    dims = [int(d) for d in shape.tolist()]
    if not allowzero:
        dims = [x.shape[i] if d == 0 else d for i, d in enumerate(dims)]
    return x.reshape(dims)


def _slice(x, starts, ends, axes=None, steps=None):
    idx = [slice(None)] * x.dim()
    axes_l = axes.tolist() if axes is not None else list(range(len(starts)))
    steps_l = steps.tolist() if steps is not None else [1] * len(starts)
    for a, s, e, st in zip(axes_l, starts.tolist(), ends.tolist(), steps_l):
        n = x.shape[a]
        idx[a] = slice(max(min(s, n), -n), max(min(e, n), -n - 1), st)
    return x[tuple(idx)]


def _shape(x, start=0, end=None):
    return torch.tensor(list(x.shape)[start:end], dtype=torch.long)


def _layer_norm(x, w, b=None, axis=-1, epsilon=1e-5, **_):
    assert axis == -1, "LayerNormalization over the last axis only"
    return F.layer_norm(x, (x.shape[-1],), w, b, epsilon)


def _reduce_sum(x, axes=None, keepdims=1, noop_with_empty_axes=0):
    if axes is None or axes.numel() == 0:
        return x if noop_with_empty_axes else x.sum(keepdim=bool(keepdims))
    return x.sum(dim=[int(a) for a in axes.tolist()], keepdim=bool(keepdims))


def _gather(x, idx, axis=0):
    if not x.is_floating_point() and x.device.type == "cpu":  # shape arithmetic
        return x[idx.long()] if idx.dim() else x[int(idx)]
    return torch.index_select(x, axis, idx.long().reshape(-1)).reshape(
        *x.shape[:axis], *idx.shape, *x.shape[axis + 1 :]
    )


def _concat(*xs, axis=0):
    dev = next((x.device for x in xs if x.device.type != "cpu"), xs[0].device)
    return torch.cat([x.to(dev) for x in xs], dim=axis)


OPS: dict[str, Op] = {
    "QuantizeLinear": quantize,
    "DequantizeLinear": dequantize,
    "Conv": _conv,
    "Gemm": _gemm,
    "MatMul": torch.matmul,
    "Add": torch.add,
    "Mul": torch.mul,
    "Div": lambda a, b: a / b,
    "Erf": torch.erf,
    "Tanh": torch.tanh,
    "Sigmoid": torch.sigmoid,
    "Softmax": lambda x, axis=-1: torch.softmax(x, axis),
    "Transpose": lambda x, perm=None: x.permute(*perm) if perm else x.T,
    "Reshape": _reshape,
    "Slice": _slice,
    "Shape": _shape,
    "Gather": _gather,
    "Concat": _concat,
    "LayerNormalization": _layer_norm,
    "ReduceSum": _reduce_sum,
}
_SHAPE_INPUTS = {"Reshape": (1,), "Slice": (1, 2, 3, 4), "ReduceSum": (1,)}  # read on the host


class TorchOnnx:
    """``source``'s graph (a file, or a loaded model) on ``device``; ``run(**inputs)`` -> its
    first output, ``run_all(**inputs)`` -> the values named by ``outputs`` (default: that first
    output; any intermediate value of the graph can be named). Contract: the inputs are float32
    tensors (any batch size); one graph, no control flow."""

    def __init__(
        self, source, device: str | torch.device = "cpu", outputs: list[str] | None = None
    ) -> None:
        import onnx
        from onnx import helper, numpy_helper

        model = source if isinstance(source, onnx.ModelProto) else onnx.load(str(source))
        path = "the graph" if isinstance(source, onnx.ModelProto) else source
        g = model.graph
        unknown = sorted({n.op_type for n in g.node} - set(OPS))
        if unknown:
            raise ValueError(f"{path}: operators this runner lacks: {', '.join(unknown)}")
        self.device = torch.device(device)
        self.inputs = [i.name for i in g.input]
        self.outputs = outputs or [g.output[0].name]
        made = {o for n in g.node for o in n.output}
        missing = [o for o in self.outputs if o not in made]
        if missing:
            raise ValueError(f"{path}: no value named {', '.join(missing)} in the graph")
        consts: dict[str, torch.Tensor] = {}
        for t in g.initializer:
            arr = numpy_helper.to_array(t)
            consts[t.name] = torch.from_numpy(np.array(arr))
        self.nodes: list[tuple[Op, list[str], list[str], dict, str]] = []
        for n in g.node:
            attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
            attrs = {k: v.decode() if isinstance(v, bytes) else v for k, v in attrs.items()}
            attrs.pop("auto_pad", None)
            attrs.pop("stash_type", None)
            ins = list(n.input)
            if all(i in consts or i == "" for i in ins):  # fold: weights, scales, shapes
                args = [consts[i] if i else None for i in ins]
                consts[n.output[0]] = OPS[n.op_type](*args, **attrs)
                continue
            self.nodes.append((OPS[n.op_type], ins, list(n.output), attrs, n.op_type))
        # shapes and indices (int64) are read on the host; everything else lives on the device
        self.consts = {
            k: v if v.dtype == torch.long else v.to(self.device) for k, v in consts.items()
        }

    def run(self, **inputs: torch.Tensor) -> torch.Tensor:
        return self.run_all(**inputs)[0]

    @torch.inference_mode()
    def run_all(self, **inputs: torch.Tensor) -> list[torch.Tensor]:
        env = dict(self.consts)
        env.update({k: v.to(self.device) for k, v in inputs.items()})
        for fn, ins, outs, attrs, op in self.nodes:
            args = [env[i] if i else None for i in ins]
            for k in _SHAPE_INPUTS.get(op, ()):
                if k < len(args) and (arg := args[k]) is not None:
                    args[k] = arg.cpu()
            env[outs[0]] = fn(*args, **attrs)
        return [env[o] for o in self.outputs]
