"""INT4 Linears side by side on the GPU machine, RANDOM WEIGHTS, each on the very same codes,
scales and zeros, against bf16 F.linear:
- our MMA kernel (kernels.int4_linear);
- gemlite's A16W4 kernels, a well-kept Triton library (Apache-2.0): GEMV "RevSplit-K" at one
  row (its output summed in bf16, as by default, and in fp32), split-K GEMM up to 64 rows,
  GEMM above.
GPU time per call (a CUDA graph of 20 calls, median of 30), the GB/s of the bytes read, and
each result's largest error against F.linear on the widened weights (fp32).

Usage (GPU machine, repo root, gemlite installed --no-deps):
    python3 scripts/gpu/int4_gemlite.py [8b[,1b]] [1,16,64,600]
"""

import sys

import torch

from voicert.bench.fp8 import SHAPE_SETS, _linear, time_graph
from voicert.engine.gpu import kernels
from voicert.engine.gpu.awq import awq_zeros
from voicert.engine.gpu.int4 import Int4Linear, unpack


def gemlite_layer(q: Int4Linear, out_dtype: str = "BF16"):
    """gemlite's A16W4 layer over q's codes: (code - zero) * scale per group, ours on AWQ's grid
    (``integer_zero``: the zeros are ``awq_zeros``); its output in ``out_dtype`` (its one-row kernel adds the K splits' sums into it atomically)."""
    from gemlite import DType, GemLiteLinear

    layer = GemLiteLinear(
        4,
        group_size=q.group,
        in_features=q.in_features,
        out_features=q.out_features,
        input_dtype=DType.BF16,
        output_dtype=getattr(DType, out_dtype),
    )
    codes = unpack(q.weight, q.group)  # [N, K] uint8
    return layer.pack(codes, q.scale, q.scale.new_tensor(awq_zeros(q)), None, fma_mode=False)


def err(got: torch.Tensor, want: torch.Tensor) -> float:
    """The largest error relative to the largest output."""
    return float((got.float() - want).abs().max() / want.abs().max())


def main(shapes: str = "8b", rows: str = "1,16,64,600") -> None:
    print(torch.cuda.get_device_name(), torch.__version__, flush=True)
    for shape in shapes.split(","):
        for name, n, k in SHAPE_SETS[f"llama-{shape}"]:
            w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
            q = Int4Linear.from_linear(_linear(w), integer_zero=True)
            nbytes = q.weight.nbytes + q.scale.nbytes + q.zero.nbytes
            wide = q.dequantized(torch.float32)
            gl, gl32 = gemlite_layer(q), gemlite_layer(q, "FP32")
            for m in [int(r) for r in rows.split(",")]:
                x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                want = torch.nn.functional.linear(x.float(), wide)
                runs = {
                    "bf16": lambda x=x: torch.nn.functional.linear(x, w),
                    "ours": lambda x=x: kernels.int4_linear(x, q.weight, q.scale, q.zero, None),
                    "gemlite": lambda x=x: gl(x),
                }
                if m == 1:
                    runs["gemlite fp32 out"] = lambda x=x: gl32(x).to(x.dtype)
                cells = []
                base = None
                for label, fn in runs.items():
                    try:
                        e = err(fn(), want) if label != "bf16" else 0.0  # also autotunes
                        t = time_graph(fn)
                    except Exception as ex:  # a row says why, then the bench goes on
                        cells.append(f"{label} failed: {type(ex).__name__}: {str(ex)[:120]}")
                        continue
                    base = t if label == "bf16" else base
                    cells.append(
                        f"{label} {t:.1f} us ({(w.nbytes if label == 'bf16' else nbytes) / t / 1e3:.0f} GB/s, "
                        f"{base / t:.2f}x, err {e:.1e})"
                    )
                print(f"{shape} {name} {n}x{k} rows {m}: " + " | ".join(cells), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
