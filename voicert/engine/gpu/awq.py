"""AWQ checkpoints (the "gemm" format of AutoAWQ, which vLLM, TGI and transformers read) in and
out of :class:`~voicert.engine.gpu.int4.Int4Linear`.

An AWQ layer holds, for weights w [N, K] (HF's orientation) in groups of ``group_size`` input
columns (G = K / group_size)::

    qweight int32 [K, N / 8]   codes; nibble i of column c is output column 8c + ORDER[i]
    qzeros  int32 [G, N / 8]   zero points, packed the same way
    scales  float16 [G, N]
    w[n, k] = (code[k, n] - zero[g, n]) * scale[g, n],  g = k // group_size

That is INT4's grid (int4.py: ``code * scale + low`` per row and group) with ``low = -zero *
scale``, rounded to float16 (at most 2^-12 of the low, the only rounding on load). A layer
whose lows are such products exports exactly: ``round(-low / scale)`` is its zero again. A
layer quantized on int4.py's own grid (any float low) does not: :func:`to_awq` refuses it,
saying how far its lows lie off integer zeros. The loader (models/layers.py ``load_hf``) meets the
fused layers (q/k/v, gate/up) through :func:`row_record`: each layer as one uint8 tensor of rows
[N, K/2 + 4G] (its packed codes, its scales' and lows' bytes), which concatenates along N as
weights do.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from voicert.engine.gpu.int4 import GROUPS, LEVELS, Int4Linear, pack, unpack

ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # AWQ's nibble order within an int32 of 8 output columns
SHIFTS = torch.arange(0, 32, 4, dtype=torch.int32)  # nibble i at bits 4i


def awq_group(config: dict) -> int | None:
    """An HF ``config.json``'s group size when it describes an AWQ checkpoint this loader reads
    (4 bits, zero points, the gemm layout); None when it is not quantized. ValueError naming the
    field for a quantized checkpoint of another kind."""
    q = config.get("quantization_config")
    if not q:
        return None
    method = q.get("quant_method")
    if method != "awq":
        raise ValueError(
            f"quantization_config.quant_method {method!r}: only AWQ checkpoints load (or the "
            "unquantized model with llm.int4 / llm.fp8)"
        )
    if q.get("bits", q.get("w_bit")) != 4 or not q.get("zero_point", True):
        raise ValueError("quantization_config: AWQ checkpoints load with bits 4 and zero_point")
    if str(q.get("version", "gemm")).lower() != "gemm":
        raise ValueError(f"quantization_config.version {q.get('version')!r}: only gemm loads")
    group = int(q.get("group_size", q.get("q_group_size", 128)))
    if group not in GROUPS:
        raise ValueError(f"quantization_config.group_size {group}: must be one of {GROUPS}")
    return group


def _unpack_cols(packed: torch.Tensor) -> torch.Tensor:
    """int32 [R, C / 8] in AWQ's order -> uint8 [R, C] (column c, in order)."""
    r = packed.shape[0]
    nib = (packed[:, :, None] >> SHIFTS.to(packed.device)) & 15  # [R, C/8, 8]: nibble i
    out = torch.empty_like(nib)
    out[:, :, list(ORDER)] = nib  # nibble i holds column ORDER[i]
    return out.reshape(r, -1).to(torch.uint8)


def _pack_cols(values: torch.Tensor) -> torch.Tensor:
    """uint8 / int [R, C] (C a multiple of 8, values in [0, 15]) -> int32 [R, C / 8] in AWQ's
    order (the inverse of :func:`_unpack_cols`)."""
    r, c = values.shape
    v = values.to(torch.int32).reshape(r, c // 8, 8)[:, :, list(ORDER)]  # nibble i: col ORDER[i]
    return (v << SHIFTS.to(v.device)).sum(dim=2, dtype=torch.int32)  # disjoint bits: sum == or


def from_awq(
    qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """An AWQ layer -> (packed uint8 [N, K/2] in int4.py's layout, scale float16 [N, G], low
    float16 [N, G] = -zero * scale)."""
    k = qweight.shape[0]
    group = k // scales.shape[0]
    codes = _unpack_cols(qweight).t().contiguous()  # [N, K]
    zero = _unpack_cols(qzeros).t().contiguous()  # [N, G]
    scale = scales.t().contiguous().half()
    return pack(codes, group), scale, (-zero.float() * scale.float()).half()


def awq_zeros(lin: Int4Linear, tolerance: float = 0.01) -> torch.Tensor:
    """``lin``'s integer zeros uint8 [N, G] for AWQ, ``round(-low / scale)``. ValueError when
    a low lies more than ``tolerance`` of a step off such a zero, or outside [-15, 0] steps (a
    layer from int4.py's own grid, not from AWQ's: exporting it would move its weights)."""
    steps = -lin.low.float() / lin.scale.float()  # [N, G]
    zero = steps.round()
    off = (steps - zero).abs().max().item() if steps.numel() else 0.0
    if off > tolerance or (zero < 0).any() or (zero > LEVELS).any():
        raise ValueError(
            f"to_awq: the layer's lows are not integer zeros (off by up to {off:.3f} of a step, "
            f"zeros {zero.min().item():.0f}..{zero.max().item():.0f}): AWQ cannot hold its grid"
        )
    return zero.to(torch.uint8)


def to_awq(lin: Int4Linear) -> dict[str, torch.Tensor]:
    """An INT4 layer -> its AWQ tensors ``qweight``, ``qzeros``, ``scales`` (and ``bias``), on
    the CPU."""
    codes = unpack(lin.weight.cpu(), lin.group)  # [N, K]
    out = {
        "qweight": _pack_cols(codes.t().contiguous()),
        "qzeros": _pack_cols(awq_zeros(lin).cpu().t().contiguous()),
        "scales": lin.scale.cpu().t().contiguous(),
    }
    if lin.bias is not None:
        out["bias"] = lin.bias.cpu()
    return out


def row_record(packed: torch.Tensor, scale: torch.Tensor, low: torch.Tensor) -> torch.Tensor:
    """A layer's three tensors as one uint8 [N, K/2 + 2G + 2G] of rows (codes, the scales' and
    the lows' bytes), so that layers fused along N (q/k/v, gate/up) fuse by concatenating
    records."""
    return torch.cat((packed, _bytes(scale), _bytes(low)), dim=1)


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """float16 [N, G] -> its bytes uint8 [N, 2G]."""
    return t.contiguous().view(-1).view(torch.uint8).view(t.shape[0], -1)


def from_record(record: torch.Tensor, in_features: int, bias: torch.Tensor | None) -> Int4Linear:
    """The :class:`Int4Linear` of a (possibly fused) :func:`row_record` for ``in_features``."""
    half = in_features // 2
    groups = (record.shape[1] - half) // 4
    packed = record[:, :half].contiguous()
    scale = record[:, half : half + 2 * groups].contiguous().view(torch.float16)
    low = record[:, half + 2 * groups :].contiguous().view(torch.float16)
    return Int4Linear(packed, scale, low, bias)


def awq_records(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A checkpoint's tensors with every AWQ layer (``P.qweight``, ``P.qzeros``, ``P.scales``)
    replaced by its :func:`row_record` under ``P.weight`` (what the architecture's renaming
    expects); other tensors as they are."""
    out = dict(state)
    for name in [n for n in state if n.endswith(".qweight")]:
        p = name.removesuffix("qweight")
        packed, scale, low = from_awq(out.pop(name), out.pop(p + "qzeros"), out.pop(p + "scales"))
        out.pop(p + "g_idx", None)  # (some exporters write an unused column order)
        out[p + "weight"] = row_record(packed, scale, low)
    return out


def save_llama_awq(model: torch.nn.Module, source_dir: str | Path, out_dir: str | Path) -> Path:
    """Write ``model`` (a LlamaModel whose layers hold :class:`Int4Linear`, loaded from the HF
    checkpoint ``source_dir``) as an AWQ checkpoint in ``out_dir``: the source's config with a
    ``quantization_config``, its tokenizer files, and one safetensors file whose INT4 layers are
    split back into q/k/v and gate/up. Other tensors are the source's."""
    from safetensors.torch import load_file, save_file

    src, out = Path(source_dir), Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    state: dict[str, torch.Tensor] = {}
    for f in sorted(src.glob("*.safetensors")):
        state.update(load_file(str(f)))
    cfg = model.cfg
    q_rows, kv_rows = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    groups = set()
    for i, layer in enumerate(model.layers):
        p = f"model.layers.{i}."
        parts = {
            "attn.qkv": [
                (p + "self_attn.q_proj.", q_rows),
                (p + "self_attn.k_proj.", kv_rows),
                (p + "self_attn.v_proj.", kv_rows),
            ],
            "attn.o": [(p + "self_attn.o_proj.", None)],
            "mlp.gate_up": [
                (p + "mlp.gate_proj.", cfg.intermediate_size),
                (p + "mlp.up_proj.", cfg.intermediate_size),
            ],
            "mlp.down": [(p + "mlp.down_proj.", None)],
        }
        for ours, hf in parts.items():
            lin = layer.get_submodule(ours)
            if not isinstance(lin, Int4Linear):
                continue
            groups.add(lin.group)
            first = 0
            for prefix, rows in hf:
                rows = rows or lin.out_features
                piece = Int4Linear(
                    lin.weight[first : first + rows],
                    lin.scale[first : first + rows],
                    lin.low[first : first + rows],
                    None if lin.bias is None else lin.bias[first : first + rows],
                )
                first += rows
                state.pop(prefix + "weight", None)
                state.update({prefix + k: v for k, v in to_awq(piece).items()})
    if len(groups) != 1:
        raise ValueError(f"save_llama_awq: the layers' groups are {sorted(groups)}: need one")
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"] = {
        "quant_method": "awq",
        "bits": 4,
        "group_size": groups.pop(),
        "zero_point": True,
        "version": "gemm",
    }
    (out / "config.json").write_text(json.dumps(config, indent=2))
    save_file({k: v.contiguous() for k, v in state.items()}, str(out / "model.safetensors"))
    for f in src.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "chat_template", "generation_config")):
            (out / f.name).write_bytes(f.read_bytes())
    return out
