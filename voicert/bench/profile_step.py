"""Where one decode step's time goes: ``python -m voicert.bench.profile_step``.

Runs eager decode steps of a random-weight model (timing only) under torch.profiler and prints the
kernels by total device time; then times the CUDA graph of the same step: one step at a
time as the engine runs it (staging, replay, ``tolist``), and replays back to back with one sync at
the end (the GPU's own time per step, launch gaps inside the graph included). The difference is
what the host adds per step. Last, steps overlapped as the engine runs plain decoding (each
queued before the previous one's tokens are read)."""

from __future__ import annotations

import argparse
import time

import torch

from voicert.bench.shapes import SHAPES, shape_config
from voicert.engine.core.runner import ModelRunner, Row, StepGraphs
from voicert.engine.models.llama import DTYPES, LlamaConfig, random_llama


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="llama-1b-random", choices=sorted(SHAPES))
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--context", type=int, default=600)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument(
        "--fused-kernels",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the Triton kernels (voicert.engine.gpu.kernels) or the torch path",
    )
    ap.add_argument(
        "--split-target",
        type=int,
        default=None,
        help="fused kernels: attention programs to aim for when splitting keys "
        "(kernels.attention._SPLIT_TARGET; fewer: fewer, longer splits)",
    )
    ap.add_argument(
        "--pdl",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="fused kernels: programmatic dependent launch where the GPU has it (llm.pdl)",
    )
    ap.add_argument(
        "--fp8", action="store_true", help="FP8 layer weights (engine/gpu/fp8.py), nearest"
    )
    ap.add_argument(
        "--int4", action="store_true", help="INT4 layer weights (engine/gpu/int4.py), nearest"
    )
    ap.add_argument(
        "--fp8-mma-rows",
        type=int,
        default=None,
        help="FP8: steps of more rows than this quantize their activations and run "
        "on the FP8 tensor cores (kernels.fp8_matmul.FP8_MMA_ROWS)",
    )
    ap.add_argument(
        "--triton-linear-rows",
        type=int,
        default=0,
        help="fused kernels: steps of at most this many rows run bf16 Linears through "
        "the Triton kernel instead of cuBLAS",
    )
    args = ap.parse_args(argv)
    from voicert.engine.gpu import kernels  # (after the arguments: it needs Triton)

    if not 0 <= args.triton_linear_rows <= kernels.fp8_matmul.LINEAR_ROWS:
        ap.error(
            f"--triton-linear-rows must be in [0, {kernels.fp8_matmul.LINEAR_ROWS}] (the tiles are "
            "measured for that many rows)"
        )
    if args.fp8 and args.int4:
        ap.error("--fp8 and --int4 are two quantizations: choose one")
    if args.fp8_mma_rows is not None and not args.fp8:
        ap.error("--fp8-mma-rows needs --fp8 (it picks the FP8 Linears' path)")
    dev = "cuda"
    if args.split_target is not None:
        kernels.attention._SPLIT_TARGET = args.split_target
    if args.fp8_mma_rows is not None:
        kernels.fp8_matmul.FP8_MMA_ROWS = args.fp8_mma_rows
    cfg = LlamaConfig.from_hf(shape_config(args.model))
    model = random_llama(cfg, DTYPES[args.dtype], dev)
    if args.fp8:
        from voicert.engine.gpu.fp8 import quantize_fp8

        quantize_fp8(model)
    if args.int4:
        from voicert.engine.gpu.int4 import quantize_int4

        quantize_int4(model)
    model.use_kernels = args.fused_kernels
    model.triton_linear_rows = args.triton_linear_rows
    if args.triton_linear_rows:
        model.linear_tiles = kernels.linear_tiles(
            torch.cuda.get_device_name(dev), DTYPES[args.dtype]
        )
    if args.fused_kernels and args.pdl:
        model.pdl = kernels.pdl_supported(dev)
    bs = 16
    per_seq = -(-(args.context + 1) // bs)
    runner = ModelRunner(model, 1 + per_seq * args.batch, bs)
    rows = [
        Row([100], args.context, list(range(1 + i * per_seq, 1 + (i + 1) * per_seq)), 0)
        for i in range(args.batch)
    ]
    ids, inp = runner.prepare(rows)
    with torch.inference_mode():
        for _ in range(3):
            runner.forward(ids, inp, runner.k_pool, runner.v_pool)
        torch.cuda.synchronize()
        with torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CUDA, torch.profiler.ProfilerActivity.CPU]
        ) as prof:
            for _ in range(5):
                h = runner.forward(ids, inp, runner.k_pool, runner.v_pool)
                model.greedy(h[:, -1])
            torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=30))
    step, gpu, host_min, overlapped = time_graph_step(runner, rows, args.batch, args.context)
    print(
        f"batch {args.batch}, context {args.context}: graph step (staging + replay + tolist) "
        f"P50 {step:.3f} ms, min {host_min:.3f} ms; replays back to back {gpu:.4f} ms per step "
        f"(GPU time); host adds {step - gpu:.3f} ms; overlapped steps (next queued before "
        f"reading the last) {overlapped:.3f} ms per step"
    )


def time_graph_step(
    runner: ModelRunner, rows: list[Row], batch: int, context: int
) -> tuple[float, float, float, float]:
    """(graph step P50 ms with staging and reading, GPU ms per step of replays back to back,
    graph step min ms, ms per step when each is queued before the last is read), with a CUDA
    graph captured now."""
    graphs = StepGraphs(runner, [batch], [1], context + 64, sample_last=False)
    times = []
    for _ in range(200):
        torch.cuda.synchronize()
        t = time.perf_counter_ns()
        graphs.run(rows)
        times.append((time.perf_counter_ns() - t) / 1e6)
    times.sort()
    graphs.run(rows)  # staged: the replays below reuse these inputs
    graph = next(iter(graphs.graphs.values()))
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    back = []
    for _ in range(10):
        start.record()
        for _ in range(50):
            graph.replay()
        end.record()
        end.synchronize()
        back.append(start.elapsed_time(end) / 50)
    back.sort()
    pending = graphs.launch(rows)  # overlapped: each step queued before the last one is read
    t = time.perf_counter_ns()
    for _ in range(200):
        nxt = graphs.launch(rows, fed=True)
        pending.result()
        pending = nxt
    pending.result()
    overlapped = (time.perf_counter_ns() - t) / 1e6 / 200
    return times[100], back[5], times[0], overlapped


if __name__ == "__main__":
    main()
