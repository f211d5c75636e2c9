"""``python -m voicert.bench.long_rows``: what one long conversation costs the short ones beside it.

A CPU decode step gathers every row's keys and scores them in one batch. Padded to the longest
row, one caller with a 2,000-token history makes each short reply's step pay for 2,000 keys.
Attending in key groups (engine/models/layers.py ``KeyGroups``) pads each row only to rows of
like length.

The engine is built as the server builds it (the config's ``llm`` section, the embedded model
unless ``--set models.llm=...``). ``--short`` replies of ``--short-tokens`` prompt tokens decode:

- alone;
- beside a reply with a ``--long``-token prompt (prefix-cached after the first round), padded;
- the same, in key groups.

The three cases alternate, round by round. Each row gives the decode step's time (the short
replies' gap between tokens) as P50 / P95 / P99 over ``--rounds`` x ``--steps`` steps, and its
ratio against the short rows alone.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

CASES = ("short rows alone", "beside the long row, padded", "beside the long row, key groups")


def _steps(core, prompts: list[list[int]], n: int, tag: str) -> list[float]:
    """ms of each of ``n`` decode steps once every prompt has its first token (then aborted)."""
    from voicert.core.llm import GenerationRequest

    ids = [f"{tag}-{i}" for i in range(len(prompts))]
    for rid, p in zip(ids, prompts, strict=True):
        core.add(GenerationRequest(rid, [], n + 8, ignore_eos=True, prompt_ids=p))
    started: set[str] = set()
    while len(started) < len(ids):
        started |= {o.request_id for o in core.step() if o.token_id >= 0}
    times = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        core.step()
        times.append((time.perf_counter_ns() - t0) / 1e6)
    for rid in ids:
        core.abort(rid)
    while core.has_work():
        core.step()
    return times


def main(argv: list[str] | None = None) -> int:
    from voicert.config import cache_dir, load_config
    from voicert.engine.build import build_core
    from voicert.engine.loader import resolve_llm
    from voicert.engine.settings import engine_config

    ap = argparse.ArgumentParser(prog="python -m voicert.bench.long_rows", description=__doc__)
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    ap.add_argument("--long", type=int, default=2000, help="tokens of the long prompt")
    ap.add_argument("--short", type=int, default=4, help="short replies decoding together")
    ap.add_argument("--short-tokens", type=int, default=60, help="tokens of each short prompt")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--steps", type=int, default=16, help="decode steps timed a round")
    args = ap.parse_args(argv)
    cfg = load_config(None, dict(kv.split("=", 1) for kv in args.set))
    cache = cache_dir(cfg.models)
    core = build_core(str(resolve_llm(cfg.models.llm, cache)), engine_config(cfg.llm, str(cache)))
    runner = core.runner
    if not runner.key_groups:
        print("this engine pads every row (GPU kernels or a one-byte KV pool): nothing to compare")
        return 1
    rng = np.random.default_rng(0)
    vocab = core.model.cfg.vocab_size
    long_ids = rng.integers(100, vocab - 100, args.long).tolist()
    times: dict[str, list[float]] = {c: [] for c in CASES}
    _steps(core, [long_ids], 1, "warm")  # the long prompt into the prefix cache
    for r in range(args.rounds):
        shorts = [
            rng.integers(100, vocab - 100, args.short_tokens).tolist() for _ in range(args.short)
        ]
        for case in CASES:
            runner.key_groups = case != CASES[1]
            prompts = shorts if case == CASES[0] else [*shorts, long_ids]
            times[case] += _steps(core, prompts, args.steps, f"{r}-{CASES.index(case)}")
    runner.key_groups = True
    base = np.percentile(times[CASES[0]], 50)
    print(
        f"{args.short} replies of {args.short_tokens} prompt tokens, one of {args.long}; "
        f"llm {cfg.models.llm} on {cfg.llm.device}, {args.rounds} x {args.steps} steps"
    )
    print("| decode step | P50 / P95 / P99 | P50 vs alone |")
    print("|---|---:|---:|")
    for case, ms in times.items():
        p50, p95, p99 = np.percentile(ms, [50, 95, 99])
        print(f"| {case} | {p50:.1f} / {p95:.1f} / {p99:.1f} ms | {p50 / base:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
