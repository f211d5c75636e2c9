"""INT4 in groups of 32 at one row, Llama-8B's shapes: the GROUPS kernel (one group a K step)
against STEPS (kernels._int4_steps_kernel: the weights widened whole, 128 columns a K step) in
a few tiles, with each one's error against F.linear on the widened weights (bf16's for scale).
Written, and tested in Triton's interpreter, when no device time was left to compile or time it
(docs/benchmarks.md section 63); STEPS becomes the default for small groups
(kernels.INT4_STEPS_GROUP) only if this measures it faster.

Usage (GPU): python3 scripts/gpu/int4_steps.py"""

import torch

from voicert.bench.fp8 import _linear, time_graph
from voicert.engine.gpu import kernels
from voicert.engine.gpu.int4 import Int4Linear

P = kernels.Int4Path
for name, n, k in [("qkv", 6144, 4096), ("gate_up", 28672, 4096), ("down", 4096, 14336)]:
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
    q = Int4Linear.from_linear(_linear(w), None, 32)
    x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
    want = torch.nn.functional.linear(x.float(), q.dequantized(torch.float32))
    row = [f"{name} bf16 {time_graph(lambda: torch.nn.functional.linear(x, w)):.1f}"]
    for path, t in [
        (P.GROUPS, None),
        (P.STEPS, None),
        (P.STEPS, (16, 128, 4, 3)),
        (P.STEPS, (16, 32, 4, 3)),
        (P.STEPS, (16, 64, 8, 3)),
        (P.STEPS, (16, 64, 4, 4)),
    ]:
        f = lambda: kernels.int4_linear(x, q.weight, q.scale, q.low, None, None, t, path=path)
        err = ((f().float() - want).norm() / want.norm()).item()
        row.append(
            f"{path.value}{'' if t is None else 'x'.join(map(str, t))} {time_graph(f):.1f} (err {err:.1e})"
        )
    print(" | ".join(row), flush=True)
