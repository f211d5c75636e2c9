"""bf16 Linears at few rows: cuBLAS (F.linear) against kernels.fp8_linear's kernel run unscaled on
bf16 weights, per tile setting. GPU microseconds per call inside a CUDA graph of 20 calls (median
of 30 replays, ``bench.fp8.time_graph``) and the weight bytes read per second. With --json, each
shape's fastest setting (least time summed over the row counts) is written into that tiles file
under this GPU's name (the engine's ``kernels.linear_tiles`` reads
``voicert/engine/data/linear_tiles.json``).

    python3 scripts/gpu/gemv_bf16.py [--rows 1,8] [--json voicert/engine/data/linear_tiles.json]
"""

import argparse
import json
import os
from pathlib import Path

import torch

from voicert.bench.fp8 import time_graph
from voicert.engine.gpu import kernels

# (N, K) of each Linear of the shapes bench.engine serves: Llama-3.2-1B, Llama-3.1-8B, SmolLM2-135M
SHAPES = {
    "1b qkv": (3072, 2048),
    "1b o": (2048, 2048),
    "1b gate_up": (16384, 2048),
    "1b down": (2048, 8192),
    "8b qkv": (6144, 4096),
    "8b o": (4096, 4096),
    "8b gate_up": (28672, 4096),
    "8b down": (4096, 14336),
    "smollm2 qkv": (960, 576),
    "smollm2 o": (576, 576),
    "smollm2 gate_up": (3072, 576),
    "smollm2 down": (576, 1536),
}
# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages); the split over K follows fp8_blocks' rule
BLOCKS = [
    (16, 64, 128, 4, 4),
    (16, 32, 256, 4, 4),
    (16, 32, 128, 4, 4),
    (16, 64, 64, 4, 4),
    (16, 32, 256, 4, 3),
    (16, 64, 128, 8, 3),
    (16, 128, 64, 4, 4),
    (16, 64, 256, 4, 3),
    (16, 32, 64, 4, 4),
    (16, 16, 128, 4, 4),
]


def dump_table(table: dict) -> str:
    """The tiles file as JSON with one line per shape."""
    devices = ",\n".join(
        f"  {json.dumps(gpu)}: {{\n"
        + ",\n".join(
            f"   {json.dumps(dt)}: {{\n"
            + ",\n".join(f"    {json.dumps(shape)}: {json.dumps(v)}" for shape, v in shapes.items())
            + "\n   }"
            for dt, shapes in dtypes.items()
        )
        + "\n  }"
        for gpu, dtypes in table["devices"].items()
    )
    return f'{{\n "about": {json.dumps(table["about"])},\n "devices": {{\n{devices}\n }}\n}}\n'


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1,8")
    ap.add_argument("--json", help="tiles file to update with this GPU's best settings")
    args = ap.parse_args()
    rows = [int(r) for r in args.rows.split(",")]
    count = kernels.counters("cuda")
    print(f"# {torch.cuda.get_device_name()}; GPU us per call (GB/s of weights)\n")
    print(
        "| shape | rows | cuBLAS | "
        + " | ".join("x".join(map(str, b[:3])) + f" w{b[3]} s{b[4]}" for b in BLOCKS)
        + " |"
    )
    print("|---|---:|---:|" + "---:|" * len(BLOCKS))
    best = {}
    for name, (n, k) in SHAPES.items():
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
        gb = n * k * 2 / 1e9
        total = [0.0] * len(BLOCKS)
        for m in rows:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            want = torch.nn.functional.linear(x, w).float()
            base = time_graph(lambda: torch.nn.functional.linear(x, w))
            cells = []
            for i, b in enumerate(BLOCKS):
                got = kernels.fp8_linear(x, w, None, None, count, blocks=b).float()
                err = ((got - want).norm() / want.norm()).item()
                assert err < 1e-2, (name, m, b, err)
                t = time_graph(lambda: kernels.fp8_linear(x, w, None, None, count, blocks=b))
                total[i] += t
                cells.append(f"{t:.1f} ({gb / t * 1e6:.0f})")
            print(
                f"| {name} | {m} | {base:.1f} ({gb / base * 1e6:.0f}) | " + " | ".join(cells) + " |"
            )
        best[f"{n}x{k}"] = list(BLOCKS[min(range(len(BLOCKS)), key=total.__getitem__)])
    if args.json:
        table = (
            json.loads(Path(args.json).read_text())
            if os.path.exists(args.json)
            else {"about": "", "devices": {}}
        )
        table["devices"].setdefault(torch.cuda.get_device_name(), {})["bfloat16"] = best
        with open(args.json, "w") as f:
            f.write(dump_table(table))
        print(f"\nwrote {len(best)} shapes to {args.json}")


if __name__ == "__main__":
    main()
