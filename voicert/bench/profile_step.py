"""Where one decode step's time goes: ``python -m voicert.bench.profile_step``.

Runs eager decode steps of a random-weight model (timing only) under torch.profiler and prints the
kernels by total device time, plus the replay time of the CUDA graph for the same step."""

from __future__ import annotations

import argparse
import time

import torch

from voicert.bench.engine import SHAPES
from voicert.engine.models.llama import DTYPES, LlamaConfig, random_llama
from voicert.engine.runner import ModelRunner, Row, StepGraphs


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="llama-1b-random", choices=sorted(SHAPES))
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--context", type=int, default=600)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--fused-kernels", action=argparse.BooleanOptionalAction, default=True,
                    help="the Triton kernels (voicert.engine.kernels) or the torch path")
    args = ap.parse_args(argv)
    dev = "cuda"
    cfg = LlamaConfig.from_hf(dict(SHAPES[args.model], model_type="llama"))
    model = random_llama(cfg, DTYPES[args.dtype], dev)
    model.use_kernels = args.fused_kernels
    bs = 16
    per_seq = -(-(args.context + 1) // bs)
    runner = ModelRunner(model, 1 + per_seq * args.batch, bs)
    rows = [Row([100], args.context, list(range(1 + i * per_seq, 1 + (i + 1) * per_seq)), 0)
            for i in range(args.batch)]
    ids, inp = runner.prepare(rows)
    with torch.inference_mode():
        for _ in range(3):
            runner.forward(ids, inp, runner.k_pool, runner.v_pool)
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA,
                                                torch.profiler.ProfilerActivity.CPU]) as prof:
            for _ in range(5):
                h = runner.forward(ids, inp, runner.k_pool, runner.v_pool)
                model.logits(h[:, -1]).argmax(-1)
            torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=25))
    graphs = StepGraphs(runner, [args.batch], [1], args.context + 64, sample_last=False)
    times = []
    for _ in range(50):
        torch.cuda.synchronize()
        t = time.perf_counter()
        graphs.run(rows)
        times.append((time.perf_counter() - t) * 1000)
    times.sort()
    print(f"graph step (replay + staging + tolist), batch {args.batch}, context {args.context}: "
          f"P50 {times[25]:.3f} ms, min {times[0]:.3f} ms")


if __name__ == "__main__":
    main()
