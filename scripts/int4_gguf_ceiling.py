"""How close INT4 could come to a Q4_K_M GGUF that serves as its own reference (issue 44's INT4
quality target), by which of the file's tensors are rounded again and how.

The reference is the GGUF dequantized (what ``--model FILE.gguf`` loads). Each variant rebuilds
the layers' Linears from the reference, tensor by tensor by the GGUF's type (Q4_K or Q6_K), and
prints top-1 agreement, teacher-forced, over bench.fp8's two text sets (CPU, float32):

- ``Q4_K as is``: the Q4_K tensors kept exactly. Each 32-column group of a Q4_K tensor is
  ``d * sc * q - dmin * m``, so an INT4 format with a float offset per group of 32 would hold
  it. voicert's INT4 has an integer zero point and cannot.
- ``Q4_K on voicert's grid``: those tensors rounded to nearest on voicert's INT4 grid (groups of
  32, integer zero).
- The Q6_K tensors (half the layers' ffn_down and attn_v, in Q4_K_M) kept, rounded to INT4, or
  rounded to FP8.

Usage: python scripts/int4_gguf_ceiling.py FILE.gguf   (docs/benchmarks.md section 62)
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import torch
from gguf import GGUFReader
from transformers import AutoTokenizer

from voicert.bench.fp8 import TEXTS, _linear, agreement, next_tokens, turn_texts
from voicert.config import cache_dir, load_config
from voicert.engine.gpu.fp8 import Fp8Linear
from voicert.engine.gpu.int4 import Int4Linear
from voicert.engine.loader import resolve_llm
from voicert.engine.models.registry import load_model

Round = Callable[[torch.Tensor], torch.Tensor]


def int4(group: int) -> Round:
    """Weights [N, K] -> voicert's INT4 on them (nearest, ``group`` columns a group), widened."""
    return lambda w: Int4Linear.from_linear(_linear(w), None, group).dequantized(torch.float32)


def fp8(w: torch.Tensor) -> torch.Tensor:
    """Weights [N, K] -> voicert's FP8 on them (nearest, a scale per row), widened."""
    return Fp8Linear.from_linear(_linear(w)).dequantized(torch.float32)


def keep(w: torch.Tensor) -> torch.Tensor:
    return w.clone()


def main(path: str) -> None:
    types = {t.name: t.tensor_type.name for t in GGUFReader(path).tensors}
    layer_types = {
        t for name, t in types.items() if name.startswith("blk.") and "_norm" not in name
    }
    if not layer_types <= {"Q4_K", "Q6_K", "F32"}:  # F32: biases
        sys.exit(f"{path}: layer tensors of {sorted(layer_types)}; this script reads Q4_K_M files")
    for name in (n for n in types if n.endswith((".attn_q.weight", ".ffn_gate.weight"))):
        twin = name.replace("attn_q", "attn_k").replace("ffn_gate", "ffn_up")
        if types[name] != types[twin]:  # parts of one fused Linear must share a type
            sys.exit(f"{name} and {twin} differ in type; this script assumes not")
    model, sets, ref = reference(path)
    layers = list(model.layers)
    orig = [
        {n: getattr(p, n).weight.detach().clone() for p, n in _parts(layer)} for layer in layers
    ]
    a = layers[0].attn
    v_rows = slice((a.h + a.kvh) * a.d, (a.h + 2 * a.kvh) * a.d)  # qkv's rows: q, k, then v
    variants: list[tuple[str, Round, Round]] = [
        ("Q4_K as is, Q6_K to INT4 g32", keep, int4(32)),
        ("Q4_K as is, Q6_K to INT4 g128", keep, int4(128)),
        ("Q4_K as is, Q6_K to FP8", keep, fp8),
        ("Q4_K on voicert's INT4 g32, Q6_K as is", int4(32), keep),
    ]
    for label, q4k, q6k in variants:
        for i, layer in enumerate(layers):

            def by_type(name: str, w: torch.Tensor, i: int = i) -> torch.Tensor:
                return (q6k if types[f"blk.{i}.{name}.weight"] == "Q6_K" else q4k)(w)

            w = orig[i]
            qkv = by_type("attn_q", w["qkv"])  # q and k: attn_q's type (checked above)
            qkv[v_rows] = by_type("attn_v", w["qkv"][v_rows])
            layer.attn.qkv.weight.data = qkv
            layer.attn.o.weight.data = by_type("attn_output", w["o"])
            layer.mlp.gate_up.weight.data = by_type("ffn_gate", w["gate_up"])
            layer.mlp.down.weight.data = by_type("ffn_down", w["down"])
        for name, texts in sets.items():
            same, total = agreement(ref[name], next_tokens(model, texts))
            print(f"| {label} | {name} | {same}/{total} = {100 * same / total:.1f}% |", flush=True)


def reference(path: str) -> tuple[torch.nn.Module, dict, dict]:
    """The GGUF ``path`` dequantized (float32, CPU), bench.fp8's two text sets as its token ids
    by name, and its greedy next tokens over each (teacher-forced): the reference figures."""
    model_dir = resolve_llm(path, cache_dir(load_config(environ={}).models))
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = load_model(str(model_dir), torch.float32, "cpu")
    sets = {
        "10 texts": [tok(t)["input_ids"] for t in TEXTS],
        "turn set": [tok(t)["input_ids"] for t in turn_texts()],
    }
    return model, sets, {name: next_tokens(model, texts) for name, texts in sets.items()}


def _parts(layer: torch.nn.Module) -> list[tuple[torch.nn.Module, str]]:
    return [(layer.attn, "qkv"), (layer.attn, "o"), (layer.mlp, "gate_up"), (layer.mlp, "down")]


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python scripts/int4_gguf_ceiling.py FILE.gguf")
    main(sys.argv[1])
