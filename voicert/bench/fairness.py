"""Prefill fairness benchmark: ``python -m voicert.bench.fairness``.

One client sends a long prompt (a huge conversation, say); a moment later another sends an
ordinary one. With first-come prefill the ordinary request's first token waits for every chunk of
the long prompt; the scheduler now lets prompts that fit in one step go first, passing the long
one over at most ``long_prompt_skips`` steps in a row (engine/core/scheduler.py). This measures
both policies side by side on the same engine core, with the same prompts: the short request's
TTFT (from its arrival) and the long one's, over ``--runs`` runs, and prints a Markdown table.

    python -m voicert.bench.fairness [--long 1800] [--short 40] [--runs 5] [--set llm.KEY=VALUE]
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def _one(core, long_ids: list[int], short_ids: list[int], tag: str) -> tuple[float, float]:
    """(short TTFT, long TTFT) in ms: the long prompt arrives, one engine step runs (its
    first chunk), then the short one arrives; each measured from its own arrival."""
    from voicert.core.llm import GenerationRequest

    t_long = time.perf_counter_ns()
    core.add(GenerationRequest(f"long-{tag}", [], 4, ignore_eos=True, prompt_ids=long_ids))
    first: dict[str, int] = {}
    t_short = 0
    steps = 0
    while core.has_work():
        if steps == 1:
            t_short = time.perf_counter_ns()
            core.add(
                GenerationRequest(f"short-{tag}", [], 4, ignore_eos=True, prompt_ids=short_ids)
            )
        for out in core.step():
            if out.token_id >= 0:
                first.setdefault(out.request_id.split("-")[0], time.perf_counter_ns())
        steps += 1
    return (first["short"] - t_short) / 1e6, (first["long"] - t_long) / 1e6


def main(argv: list[str] | None = None) -> int:
    import dataclasses

    from voicert.config import cache_dir, load_config
    from voicert.engine.build import build_core
    from voicert.engine.loader import resolve_llm
    from voicert.engine.settings import engine_config

    ap = argparse.ArgumentParser(prog="python -m voicert.bench.fairness", description=__doc__)
    ap.add_argument("--config", default=None)
    ap.add_argument("--set", action="append", default=[], help="section.key=value")
    ap.add_argument("--long", type=int, default=1800, help="tokens of the long prompt")
    ap.add_argument("--short", type=int, default=40, help="tokens of the ordinary prompt")
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args(argv)
    cfg = load_config(args.config, dict(kv.split("=", 1) for kv in args.set))
    cache = cache_dir(cfg.models)
    core = build_core(str(resolve_llm(cfg.models.llm, cache)), engine_config(cfg.llm, str(cache)))
    rng = np.random.default_rng(0)
    vocab = core.model.cfg.vocab_size
    rows = []
    fair = core.scheduler.cfg
    results: dict[str, list[tuple[float, float]]] = {"first come (before)": [], "fair": []}
    for run in range(args.runs):
        for name, k in (("first come (before)", 0), ("fair", fair.long_prompt_skips)):
            # fresh random prompts for each measurement: no prefix-cache hits
            long_ids = rng.integers(100, vocab - 100, args.long).tolist()
            short_ids = rng.integers(100, vocab - 100, args.short).tolist()
            core.scheduler.cfg = dataclasses.replace(fair, long_prompt_skips=k)
            results[name].append(_one(core, long_ids, short_ids, f"{run}{k}"))
    core.scheduler.cfg = fair
    base = np.median([s for s, _ in results["first come (before)"]])
    rows.append(
        f"long prompt {args.long} tokens, short {args.short}, prefill budget "
        f"{cfg.llm.prefill_token_budget}, {args.runs} runs, {cfg.llm.device}"
    )
    rows += [
        "",
        "| policy | short TTFT P50 / max | long TTFT P50 / max | short TTFT vs before |",
        "|---|---:|---:|---:|",
    ]
    for name, res in results.items():
        short = [s for s, _ in res]
        long = [x for _, x in res]
        rows.append(
            f"| {name} | {np.median(short):.0f} / {max(short):.0f} ms "
            f"| {np.median(long):.0f} / {max(long):.0f} ms | {np.median(short) / base:.2f}x |"
        )
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
