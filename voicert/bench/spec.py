"""Speculation by batch size: ``python -m voicert.bench.spec``.

Three engines share one model in one process: plain greedy (the baseline), speculation on every
decode step (``llm.spec_policy: always``) and speculation where the policy measures it faster
(``adaptive``, engine/core/spec_policy.py). At each concurrency level all three run the same streams in
turn, several rounds, interleaved (a drifting machine slows all three alike), and the table gives
per-stream TPOT and throughput against plain, whether the replies are token-identical to plain
(greedy speculation must be), and what share of the adaptive engine's decode steps speculated.

With the embedded SmolLM2 (real weights) the streams are the voice prompt set's replies, ended by
the model's own end token; its shipped draft heads (``--drafter heads``) or n-gram prompt lookup
(``--drafter ngram``) propose. With a random-weight shape (``--model llama-1b-random``; timing
only, labelled) the prompts are random tokens, replies run to ``--new-tokens``, and n-grams
rarely match: the case where speculation must turn itself off.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from voicert.bench.engine import voice_prompt_ids
from voicert.bench.shapes import SHAPES, NullTokenizer, shape_config
from voicert.config import ConfigError
from voicert.core.llm import GenerationRequest, Sampling
from voicert.engine.clients.llm_engine import LLMEngine
from voicert.engine.models.llama import DTYPES, LlamaConfig, load_llama, random_llama
from voicert.engine.settings import EngineConfig

MODES = ("plain", "always", "adaptive")


@dataclass
class Level:
    """One concurrency level's figures for one engine, over the measured rounds."""

    tpots: list[float] = field(default_factory=list)  # per stream, ms
    done: list[float] = field(default_factory=list)  # per stream: submit -> last token, ms
    tokens: int = 0
    wall_s: float = 0.0
    replies: list[list[int]] = field(default_factory=list)  # the last round's, by stream
    verify_steps: int = 0
    plain_steps: int = 0


async def run_streams(
    engine: LLMEngine,
    prompts: list[list[int]],
    new: int,
    ignore_eos: bool,
    temperature: float = 0.0,
) -> tuple[list[list[int]], list[float], list[float], float]:
    """All prompts at once: (each reply's tokens, each stream's TPOT in ms, each reply's time
    from submit to its last token in ms, wall seconds). ``temperature`` above 0: each stream
    sampled at it (seed: its index, so every engine draws for the same streams)."""

    async def one(i: int, prompt: list[int]) -> tuple[list[int], float | None, float]:
        req = GenerationRequest(
            f"s{i}-{time.perf_counter_ns()}",
            [],
            new,
            ignore_eos=ignore_eos,
            prompt_ids=prompt,
            sampling=Sampling(temperature, seed=i) if temperature > 0 else Sampling(),
        )
        ids, times = [], []
        async for ev in engine.submit(req):
            if ev.finish_reason is None:
                times.append(time.perf_counter_ns())
                ids.append(ev.token_id)
        tpot = (times[-1] - times[0]) / 1e6 / (len(times) - 1) if len(times) > 1 else None
        return ids, tpot, (times[-1] - req.submit_ns) / 1e6 if times else 0.0

    t0 = time.perf_counter()
    results = await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))
    wall = time.perf_counter() - t0
    return (
        [r for r, _, _ in results],
        [t for _, t, _ in results if t is not None],
        [d for _, _, d in results],
        wall,
    )


def steps_of(engine: LLMEngine) -> tuple[int, int]:
    """(verify steps, plain decode steps) the engine's policy has seen so far."""
    policy = engine.core.scheduler.policy
    return (policy.spec_steps, policy.plain_steps) if policy is not None else (0, 0)


async def measure(
    engines: dict[str, LLMEngine],
    prompts: list[list[int]],
    new: int,
    rounds: int,
    ignore_eos: bool,
    temperature: float = 0.0,
) -> dict[str, Level]:
    """One level: a warm round each, then ``rounds`` rounds, the engines' order rotating."""
    levels = {mode: Level() for mode in engines}
    for eng in engines.values():
        await run_streams(eng, prompts, new, ignore_eos, temperature)  # graphs, cache, policy
    for r in range(rounds):
        order = list(engines)[r % len(engines) :] + list(engines)[: r % len(engines)]
        for mode in order:
            eng, lv = engines[mode], levels[mode]
            v0, p0 = steps_of(eng)
            replies, tpots, done, wall = await run_streams(
                eng, prompts, new, ignore_eos, temperature
            )
            v1, p1 = steps_of(eng)
            lv.tpots += tpots
            lv.done += done
            lv.tokens += sum(len(x) for x in replies)
            lv.wall_s += wall
            lv.replies = replies
            lv.verify_steps += v1 - v0
            lv.plain_steps += p1 - p0
    return levels


def render(
    label: str, args: argparse.Namespace, results: dict[int, dict[str, Level]], policy_table: list
) -> str:
    lines = [
        f"### Speculation by batch size: {label}",
        "",
        f"drafter: {args.drafter}, k={args.k}; {args.rounds} rounds per level, engines "
        f"interleaved; TPOT: per stream, mean over streams and rounds"
        + (
            f"; sampled at temperature {args.temperature} (seeded per stream; identical "
            "replies are not expected: each engine draws differently)"
            if args.temperature > 0
            else ""
        ),
        "",
        "| streams | plain TPOT | always TPOT | adaptive TPOT | plain tok/s | always tok/s | "
        "adaptive tok/s | adaptive: verify steps | identical to plain (always / adaptive) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for n, lv in results.items():
        base_tpot = statistics.mean(lv["plain"].tpots)
        base_tps = lv["plain"].tokens / lv["plain"].wall_s

        def cell(mode: str) -> tuple[str, str]:
            tpot = statistics.mean(lv[mode].tpots)
            tps = lv[mode].tokens / lv[mode].wall_s
            if mode == "plain":
                return f"{tpot:.2f} ms", f"{tps:.0f}"
            return f"{tpot:.2f} ms ({base_tpot / tpot:.2f}x)", f"{tps:.0f} ({tps / base_tps:.2f}x)"

        (pt, ps), (at, as_), (dt, ds) = cell("plain"), cell("always"), cell("adaptive")
        a = lv["adaptive"]
        share = a.verify_steps / max(a.verify_steps + a.plain_steps, 1)
        same = [
            sum(x == y for x, y in zip(lv[m].replies, lv["plain"].replies))
            for m in ("always", "adaptive")
        ]
        lines.append(
            f"| {n} | {pt} | {at} | {dt} | {ps} | {as_} | {ds} | {share:.0%} | "
            f"{same[0]}/{n} / {same[1]}/{n} |"
        )
    lines += [
        "",
        "Reply done (submit -> last token), P50 / P95:",
        "",
        "| streams | plain | always | adaptive |",
        "|---:|---:|---:|---:|",
    ]
    for n, lv in results.items():
        lines.append(
            f"| {n} | "
            + " | ".join(
                f"{np.percentile(lv[m].done, 50):.0f} / {np.percentile(lv[m].done, 95):.0f} ms"
                for m in MODES
            )
            + " |"
        )
    lines += [
        "",
        "The adaptive engine's measured step times at the end (per batch bucket):",
        "",
        "| batch bucket | plain step | verify step | speculates |",
        "|---:|---:|---:|---|",
    ]
    lines += [
        f"| {row.bucket} | {row.plain_ms:.2f} ms | {row.spec_ms:.2f} ms | "
        f"{'yes' if row.speculate else 'no'} |"
        for row in policy_table
    ]
    return "\n".join(lines)


def build(args: argparse.Namespace) -> tuple[str, dict[str, LLMEngine], list[list[int]], bool]:
    """(label, engines by mode, the prompts to cycle through, whether replies ignore EOS)."""
    dtype = DTYPES[args.dtype]
    if args.model in SHAPES:
        hf = shape_config(args.model)
        model = random_llama(LlamaConfig.from_hf(hf), dtype, args.device)
        tok, model_dir = NullTokenizer(model.cfg.vocab_size), ""
        rng = np.random.default_rng(0)
        prompts = [rng.integers(100, 30000, 100).tolist() for _ in range(16)]
        label, ignore_eos = f"{args.model} (RANDOM WEIGHTS, timing only)", True
    else:
        from transformers import AutoTokenizer

        from voicert.config import cache_dir, load_config
        from voicert.engine.loader import resolve_llm

        model_dir = str(resolve_llm(args.model, cache_dir(load_config(environ={}).models)))
        model = load_llama(model_dir, dtype, args.device)
        tok = AutoTokenizer.from_pretrained(model_dir)
        prompts, label, ignore_eos = voice_prompt_ids(tok), f"{args.model} ({model_dir})", False
    cuda = args.device.startswith("cuda")
    base = dict(
        device=args.device,
        dtype=args.dtype,
        kv_memory_gb=args.kv_gb,
        max_batch=max(args.streams),
        max_context_tokens=2048,
        cuda_graphs=cuda,
        fused_kernels=cuda,
        torchscript=not cuda,
    )
    heads = "embedded" if args.drafter == "heads" else ""
    engines = {"plain": LLMEngine(model_dir, EngineConfig(**base), model=model, tokenizer=tok)}
    for mode in ("always", "adaptive"):
        engines[mode] = LLMEngine(
            model_dir,
            EngineConfig(**base, spec_tokens=args.k, spec_policy=mode, draft_heads=heads),
            model=model,
            tokenizer=tok,
        )
    return label, engines, prompts, ignore_eos


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m voicert.bench.spec", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument(
        "--model",
        default="embedded",
        help="embedded (SmolLM2, real weights), a .gguf or HF directory, or a random "
        f"shape: {', '.join(SHAPES)}",
    )
    ap.add_argument(
        "--drafter",
        choices=("heads", "ngram"),
        default="heads",
        help="heads: the draft heads shipped for the embedded SmolLM2",
    )
    ap.add_argument("--k", type=int, default=2, help="drafts per verify step")
    ap.add_argument("--streams", default="1,4,16,64")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--kv-gb", type=float, default=0.0, help="each engine's KV pool (0: automatic)")
    ap.add_argument(
        "--temperature",
        type=float,
        default=0.0,
        help="above 0: streams sampled at it, drafts kept by rejection sampling (the replies "
        "then differ from plain's draw for draw; the distribution is the same)",
    )
    args = ap.parse_args(argv)
    try:
        args.streams = sorted({int(x) for x in args.streams.split(",")})
    except ValueError:
        ap.error(f"--streams {args.streams!r}: a comma-separated list of integers")
    if args.k < 1 or args.rounds < 1 or args.streams[0] < 1:
        ap.error("--k, --rounds and every --streams level must be >= 1")
    if not 0 <= args.temperature <= 2:
        ap.error("--temperature: from 0 (greedy) to 2")
    if args.drafter == "heads" and args.model in SHAPES:
        ap.error("--drafter heads: the shipped heads fit the embedded SmolLM2 only")
    args.dtype = args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32")
    if args.kv_gb == 0.0 and not args.device.startswith("cuda"):
        args.kv_gb = 0.25
    try:
        label, engines, prompts, ignore_eos = build(args)
    except (ConfigError, ValueError, OSError) as exc:
        print(f"bench.spec: {exc}", file=sys.stderr)
        return 2
    try:
        results = {}
        for n in args.streams:
            level = [prompts[i % len(prompts)] for i in range(n)]
            results[n] = asyncio.run(
                measure(engines, level, args.new_tokens, args.rounds, ignore_eos, args.temperature)
            )
            print(f"spec: {n} streams measured", file=sys.stderr, flush=True)
        print(render(label, args, results, engines["adaptive"].core.scheduler.policy.table()))
    finally:
        for eng in engines.values():
            eng.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
