"""What to do with a Q4_K_M GGUF's layers of more bits when ``llm.int4`` serves its 4-bit layers
as the file holds them (engine/gpu/gguf.py; docs/benchmarks.md section 63).

Q4_K_M keeps half the layers' ``attn_v`` and ``ffn_down`` in Q6_K. ``attn_v`` is a part of our
fused q/k/v Linear, whose q and k are Q4_K. Each variant imports the 4-bit layers, then puts
the rest on one format, and prints top-1 agreement with the dequantized file, teacher-forced
over bench.fp8's two text sets (CPU, float32, nearest rounding: a minute or two a variant):

- the Q6_K rows of a fused layer rounded to INT4 (groups of 32) inside it, the Q6_K ``down``
  layers to FP8, to INT4 (groups of 32), or kept;
- the fused layers with a Q6_K part and the Q6_K layers, whole, to FP8 (what
  ``llm.int4_gguf`` does where FP8 runs).

Usage: python scripts/int4_gguf_rest.py FILE.gguf
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

import torch
from int4_gguf_ceiling import reference  # (scripts/, beside this one)

from voicert.bench.fp8 import agreement, next_tokens
from voicert.engine.gpu.fp8 import Fp8Linear
from voicert.engine.gpu.gguf import GgufFile, _linears, import_int4
from voicert.engine.gpu.int4 import Int4Linear

Make = Callable[[torch.nn.Linear], torch.nn.Module]
VARIANTS: list[tuple[str, bool, Make]] = [
    ("Q6_K rows of q/k/v INT4 g32; Q6_K down FP8", True, Fp8Linear.from_linear),
    (
        "Q6_K rows of q/k/v INT4 g32; Q6_K down INT4 g32",
        True,
        lambda lin: Int4Linear.from_linear(lin, None, 32),
    ),
    ("Q6_K rows of q/k/v INT4 g32; Q6_K down kept", True, lambda lin: lin),
    ("q/k/v with a Q6_K part and Q6_K down FP8 (llm.int4_gguf)", False, Fp8Linear.from_linear),
]


def main(path: str) -> None:
    model, sets, ref = reference(path)
    held = [(parent, attr, lin) for _, _, parent, attr, lin in _linears(model)]
    source = GgufFile(path)
    print("| the 4-bit layers imported; the rest | layers | 10 texts | turn set |")
    print("|---|---|---:|---:|")
    for label, round_parts, make in VARIANTS:
        for parent, attr, lin in held:  # the dequantized file's weights again
            setattr(parent, attr, lin)
        t0 = time.perf_counter()
        done = import_int4(model, source, round_parts)
        for _, _, parent, attr, lin in _linears(model):
            if isinstance(lin, torch.nn.Linear):
                setattr(parent, attr, make(lin))
        row = []
        for name, texts in sets.items():
            same, total = agreement(ref[name], next_tokens(model, texts))
            row.append(f"{same}/{total} = {100 * same / total:.1f} %")
        layers = (
            f"{done.count} imported ({len(done.rounded)} with rows rounded), {len(done.left)} left"
        )
        print(f"| {label} | {layers} | {' | '.join(row)} |  ({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python scripts/int4_gguf_rest.py FILE.gguf")
    main(sys.argv[1])
