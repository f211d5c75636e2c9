"""One-row INT4 launches for Nsight Compute, RANDOM WEIGHTS: each of Llama-8B's gate_up and
down (groups of 128) three times by int4_gemv (the CUDA cores), so that ncu can skip the
compiling launches. ncu is on the GPU machine
(docs/benchmarks.md 65):

  ncu --kernel-name regex:'_int4_gemv_kernel' --launch-skip 2 --launch-count 1 \\
      --set full python3 scripts/gpu/int4_ncu.py gate_up > ncu.txt

Usage (GPU machine, repo root, PYTHONPATH as scripts/gpu/kernel-env.sh sets it):
python3 scripts/gpu/int4_ncu.py [gate_up|down]
"""

import sys

import torch

from voicert.bench.fp8 import _linear
from voicert.engine.gpu import kernels
from voicert.engine.gpu.int4 import Int4Linear

SHAPES = {"gate_up": (28672, 4096), "down": (4096, 14336)}


def main(shape: str = "gate_up") -> None:
    n, k = SHAPES[shape]
    q = Int4Linear.from_linear(_linear(torch.randn(n, k, device="cuda") * 0.02), None, 128)
    x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
    count = kernels.counters("cuda", 1 << 15)
    for _ in range(3):
        kernels.int4_gemv(x, q.weight, q.scale, q.low, None, count)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main(*sys.argv[1:])
