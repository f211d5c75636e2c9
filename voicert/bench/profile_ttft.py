"""Where a cached prompt's time to first token goes: ``python -m voicert.bench.profile_ttft``.

An :class:`~voicert.engine.core.engine_core.EngineCore` configured as ``bench.engine`` configures it (CUDA graphs,
fused kernels, overlap) over a random-weight model (timing only), driven here on this thread with
no engine thread and no event loop. For each prompt shape of ``bench.engine``'s TTFT rows (a prompt
whose first ``cached`` tokens an earlier request left in the cache, then ``new`` tokens) it prints,
per phase of the one prefill step, P50 microseconds over ``--reps`` requests:

- ``add``: the request queued (``EngineCore.add``);
- ``schedule``: the prefix cache looked up, blocks allocated, the step planned;
- ``launch``: rows laid out, staged, copied and the graph replayed (queued, not waited for);
- ``wait``: until the first token is on the host;
- ``post``: the scheduler's postprocess;
- ``gpu``: the same graph replayed back to back (CUDA events): the GPU's own time for the step;
- the host's time in the graph's ``replay()`` call alone (part of ``launch``).

Then the kernels of one eager forward of that step by total device time (``torch.profiler``).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time

import numpy as np
import torch

from voicert.bench.shapes import SHAPES, NullTokenizer, shape_config
from voicert.core.llm import GenerationRequest
from voicert.engine.build import build_core
from voicert.engine.core.engine_core import EngineCore
from voicert.engine.core.runner import bucket, rows_for
from voicert.engine.models.llama import DTYPES, LlamaConfig, random_llama
from voicert.engine.settings import EngineConfig

PHASES = ("add", "schedule", "launch", "wait", "post")


def first_token(core: EngineCore, prompt: list[int], tag: str) -> dict[str, float]:
    """One request of one new token through the core's phases (over every step its prompt
    takes); microseconds per phase, and ``steps``."""
    req = GenerationRequest(tag, [], 1, ignore_eos=True, prompt_ids=prompt)
    us = dict.fromkeys(PHASES, 0.0) | {"steps": 0}
    t0 = time.perf_counter_ns()
    core.add(req)
    us["add"] = (time.perf_counter_ns() - t0) / 1e3
    while core.has_work():
        t = [time.perf_counter_ns()]
        step, failed = core.scheduler.schedule()
        assert step is not None and not failed and step.kind == "prefill"
        t.append(time.perf_counter_ns())
        pending = core.runner.launch(step)
        t.append(time.perf_counter_ns())
        result = pending.result()
        t.append(time.perf_counter_ns())
        core.scheduler.postprocess(step, result.tokens, result.drafts)
        t.append(time.perf_counter_ns())
        for p, a, b in zip(PHASES[1:], t, t[1:]):
            us[p] += (b - a) / 1e3
        us["steps"] += 1
    return us


def graph_gpu_us(
    core: EngineCore, prompt_len: int, new: int, replays: int = 50
) -> tuple[float, float]:
    """GPU microseconds of the prefill graph a (prompt_len, new) step replays (inputs as last
    staged), back to back; and the host's microseconds in one ``replay()`` call on an idle GPU
    (P50 of 20)."""
    graphs = core.runner.prefill_graphs
    bs = core.cfg.block_size
    key = (
        bucket(1, graphs.batches),
        bucket(-(-prompt_len // bs), graphs.blocks),
        bucket(new, graphs.widths),
    )
    graph = graphs.graphs[key]
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    runs = []
    for _ in range(7):
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        end.synchronize()
        runs.append(start.elapsed_time(end) * 1e3 / replays)
    calls = []
    for _ in range(20):
        torch.cuda.synchronize()
        t = time.perf_counter_ns()
        graph.replay()
        calls.append((time.perf_counter_ns() - t) / 1e3)
    torch.cuda.synchronize()
    return float(np.median(runs)), float(np.median(calls))


def kernel_table(core: EngineCore, prompt: list[int]) -> str:
    """torch.profiler's kernels of one eager forward of ``prompt``'s prefill step (its cached
    prefix reused)."""
    req = GenerationRequest("profile", [], 1, ignore_eos=True, prompt_ids=prompt)
    core.add(req)
    step, _ = core.scheduler.schedule()
    rows = rows_for(step)
    with torch.inference_mode():
        for _ in range(3):
            core.runner.forward_rows(rows)
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                out = core.runner.forward_rows(rows)
            torch.cuda.synchronize()
    core.scheduler.postprocess(step, out.tokens, out.drafts)
    return prof.key_averages().table(sort_by="cuda_time_total", row_limit=25)


def prompt_rows(text: str) -> list[tuple[int, int]]:
    """``--rows``: comma-separated ``cached+new`` pairs of positive token counts."""
    rows = []
    for spec in text.split(","):
        try:
            cached, new = (int(x) for x in spec.split("+"))
        except ValueError:
            raise argparse.ArgumentTypeError(f"{spec!r} is not CACHED+NEW (e.g. 500+100)") from None
        if cached < 1 or new < 1:
            raise argparse.ArgumentTypeError(f"{spec!r}: both counts must be positive")
        rows.append((cached, new))
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="llama-1b-random", choices=sorted(SHAPES))
    ap.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPES))
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument(
        "--rows", type=prompt_rows, default="500+100,150+20", help="cached+new, comma-separated"
    )
    ap.add_argument("--device", default="cuda", help="cpu: the host phases only (a smoke run)")
    ap.add_argument(
        "--prefill-attention", default="auto", choices=("auto", "paged", "flash", "sdpa")
    )
    ap.add_argument(
        "--fp8", action="store_true", help="FP8 layer weights (llm.fp8), nearest rounding"
    )
    ap.add_argument(
        "--pdl",
        default="auto",
        choices=("auto", "on", "off"),
        help="programmatic dependent launch of the fused kernels (llm.pdl)",
    )
    ap.add_argument(
        "--cprofile",
        action="store_true",
        help="also print the host's functions by own time over each row's requests",
    )
    ap.add_argument(
        "--kernels",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also print the kernel table of an eager forward per row",
    )
    args = ap.parse_args(argv)
    if args.reps < 1:
        ap.error("--reps must be at least 1")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        ap.error("no CUDA GPU here: use --device cpu for the host phases only")
    cfg = LlamaConfig.from_hf(shape_config(args.model))
    gpu = args.device.startswith("cuda")
    model = random_llama(cfg, DTYPES[args.dtype], args.device)
    core = build_core(
        "",
        EngineConfig(
            device=args.device,
            dtype=args.dtype,
            kv_memory_gb=4,
            max_context_tokens=4096,
            cuda_graphs=gpu,
            fused_kernels=gpu,
            overlap=True,
            prefill_attention=args.prefill_attention,
            fp8=args.fp8,
            rounding="nearest",
            pdl=args.pdl,
        ),
        model=model,
        tokenizer=NullTokenizer(cfg.vocab_size),
    )
    rng = np.random.default_rng(0)
    tokens = lambda n: rng.integers(100, 30000, n).tolist()
    print(
        f"# {args.model} (RANDOM WEIGHTS, timing only), {args.dtype}{', FP8' if args.fp8 else ''}, "
        f"PDL {'on' if core.model.pdl else 'off'}, "
        f"{torch.cuda.get_device_name() if gpu else 'cpu'}; P50 us over {args.reps} requests\n"
    )
    print(
        "| cached + new | "
        + " | ".join(PHASES)
        + " | total (host) | gpu (graph back to back) | of launch: the replay() call |"
    )
    print("|---|" + "---:|" * (len(PHASES) + 3))
    tables, hosts = [], []
    for cached, new in args.rows:
        spec = f"{cached}+{new}"
        prefix = tokens(cached)
        first_token(core, prefix + tokens(new), "warm")
        prof = cProfile.Profile() if args.cprofile else None
        if prof is not None:
            prof.enable()
        runs = [first_token(core, prefix + tokens(new), f"r{i}") for i in range(args.reps)]
        if prof is not None:
            prof.disable()
            out = io.StringIO()
            pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(15)
            hosts.append((spec, out.getvalue()))
        p50 = {p: float(np.median([r[p] for r in runs])) for p in PHASES}
        total = float(np.median([sum(r[p] for p in PHASES) for r in runs]))
        assert all(r["steps"] == 1 for r in runs), "a measured prompt took more than one step"
        gpu_us, call_us = graph_gpu_us(core, cached + new, new) if gpu else (np.nan, np.nan)
        print(
            f"| {cached} + {new} | "
            + " | ".join(f"{p50[p]:.0f}" for p in PHASES)
            + f" | {total:.0f} | {gpu_us:.0f} | {call_us:.0f} |"
        )
        if args.kernels and gpu:
            tables.append((spec, kernel_table(core, prefix + tokens(new))))
    for spec, text in hosts:
        print(f"\n## host functions by own time, {spec} ({args.reps} requests)\n\n{text}")
    for spec, table in tables:
        print(f"\n## kernels of one eager forward, {spec}\n\n{table}")


if __name__ == "__main__":
    main()
