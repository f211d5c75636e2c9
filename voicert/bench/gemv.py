"""The fused small-batch GEMV against cuBLAS, per weight of a model shape: ``python -m voicert.bench.gemv``.

For each of a layer's weights (and the LM head) at 1 and 3 rows, times inside a CUDA graph (so no
launch overhead is counted): cuBLAS alone, cuBLAS with the unfused kernel that makes its input
(residual add + RMSNorm before qkv and gate_up, SiLU * up before down), and
``voicert.engine.kernels.gemv`` with that input computed in its prologue, over a grid of block
configurations (the one ``gemv_config`` picks is marked). Random weights: timing only."""

from __future__ import annotations

import argparse
import itertools

import torch
import torch.nn.functional as F

from voicert.bench.engine import SHAPES
from voicert.engine import kernels


def graph_us(fn, calls: int = 20, reps: int = 20) -> float:
    """GPU time per call of ``fn`` (microseconds): ``calls`` calls captured in one graph, replayed."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    g.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        start.record()
        g.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000 / calls)
    return sorted(times)[len(times) // 2]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="llama-1b-random", choices=sorted(SHAPES))
    ap.add_argument("--rows", default="1,3")
    args = ap.parse_args(argv)
    c = SHAPES[args.model]
    hid, inter, heads = c["hidden_size"], c["intermediate_size"], c["num_attention_heads"]
    kvh = c["num_key_value_heads"]
    d = hid // heads
    dev, dt = "cuda", torch.bfloat16
    torch.manual_seed(0)
    weights = {"qkv": ((heads + 2 * kvh) * d, hid, kernels.PRO_NORM),
               "o": (hid, heads * d, kernels.PRO_NONE),
               "gate_up": (2 * inter, hid, kernels.PRO_NORM),
               "down": (hid, inter, kernels.PRO_SILU),
               "lm_head": (c["vocab_size"], hid, kernels.PRO_NORM)}
    grid = [c for c in itertools.product((4, 8, 16, 32), (256, 512, 1024), (4, 8))
            if c[0] * c[1] <= 16384]
    print(f"{args.model} (random weights), bf16; GPU us per call inside a CUDA graph")
    print("| weight | rows | MB | cuBLAS | unfused input + cuBLAS | fused GEMV (picked cfg) "
          "| best fused (cfg) | TB/s best | max err |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for rows in (int(r) for r in args.rows.split(",")):
        for name, (n, k, pro) in weights.items():
            w = torch.randn(n, k, device=dev, dtype=dt) * 0.02
            nw = torch.rand(k, device=dev, dtype=dt) + 0.5
            width = 2 * k if pro == kernels.PRO_SILU else k
            x = torch.randn(rows, width, device=dev, dtype=dt)
            res = torch.randn(rows, k, device=dev, dtype=dt)
            if pro == kernels.PRO_NORM:
                def unfused(r=None):
                    v, _ = kernels.add_rms_norm(x, res if r is None else r, nw, 1e-5)
                    return F.linear(v, w)
            elif pro == kernels.PRO_SILU:
                def unfused():
                    return F.linear(kernels.silu_mul(x), w)
            else:
                def unfused():
                    return F.linear(x, w)
            ref = unfused(res.clone()) if pro == kernels.PRO_NORM else unfused()

            def fused(cfg=None):
                return kernels.gemv(x, w, None, pro, res if pro == kernels.PRO_NORM else None, nw,
                                    1e-5, cfg)[0]
            err = (fused().float() - ref.float()).abs().max().item()
            t_blas = graph_us(lambda: F.linear(x if pro != kernels.PRO_SILU else x[:, :k], w))
            t_unfused = graph_us(unfused)
            t_pick = graph_us(fused)
            best = (t_pick, kernels.gemv_config(n, k))
            if rows == 1:  # the grid at one row only (each configuration compiles)
                best = min([best] + [(graph_us(lambda cfg=cfg: fused(cfg)), cfg) for cfg in grid])
            mb = n * k * 2 / 1e6
            print(f"| {name} | {rows} | {mb:.1f} | {t_blas:.1f} | {t_unfused:.1f} | "
                  f"{t_pick:.1f} {kernels.gemv_config(n, k)} | {best[0]:.1f} {best[1]} | "
                  f"{mb / best[0]:.2f} | {err:.3g} |", flush=True)


if __name__ == "__main__":
    main()
