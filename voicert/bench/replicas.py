"""Engine replicas under conversation load: ``python -m voicert.bench.replicas``.

Drives the server's engine (``build_engine`` on a config: engine processes, one per GPU with
``--gpus 2``) with simulated voice conversations, the same command running every GPU count in
turn, and prints one Markdown table: per GPU count and number of sessions, TTFT (submit to the
first token on this side, IPC and detokenising included) P50/P95/P99, the tokens generated per
second, how placements kept conversations on their replica, each replica's share, and this
process's own event-loop lag (a level whose lag P99 is over 10 ms measured the client, not the
engines, and is marked so).

A session: the speaker talks for ``--think`` seconds (uniform in [0.5x, 1.5x]), then asks; the
request is the shared system prompt, the conversation so far and the new question, and the reply
is ``--new`` tokens (``ignore_eos``: random-weight models do not end by themselves). With
``--listen R`` the caller then hears the reply spoken at R tokens a second before talking again
(a voice call's pace; 0: the next turn starts as the reply ends, a heavier load than any
caller's). Turns that start in the first ``--warmup`` seconds are not counted. ``--set KEY=VALUE``
overrides the engine's config (``llm.fp8=true``, ``llm.int4=true``, ...), and ``--p99-bar MS``
adds a line per run: the most sessions whose TTFT P99 stayed within it.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import random
import sys
import time
from collections.abc import Awaitable, Callable

import numpy as np

from voicert.bench.engine import VOICE_PROMPTS
from voicert.core.chat import ChatMessage
from voicert.core.llm import GenerationRequest
from voicert.engine.clients.replicas import Placement, ReplicaEngine

SYSTEM = (
    "You are the voice assistant of a restaurant group. Callers book and change tables, ask "
    "about opening hours, menus, allergens, parking and gift cards. Answer in one or two "
    "short sentences, confirm names, dates, times and party sizes back to the caller, and "
    "never read out long lists. If you are not sure, ask one short question."
)


@dataclasses.dataclass
class Level:
    gpus: int
    sessions: int
    ttft_ms: list[float]
    tokens: int
    seconds: float
    lag_ms: list[float]
    shares: list[int]
    kept: float
    moved: float
    prefix_hit: float

    def row(self) -> dict:
        t = np.asarray(self.ttft_ms) if self.ttft_ms else np.asarray([float("nan")])
        lag = np.percentile(self.lag_ms, 99) if self.lag_ms else 0.0
        total = sum(self.shares) or 1
        return {
            "gpus": self.gpus,
            "sessions": self.sessions,
            "turns": len(self.ttft_ms),
            "ttft_p50": float(np.percentile(t, 50)),
            "ttft_p95": float(np.percentile(t, 95)),
            "ttft_p99": float(np.percentile(t, 99)),
            "tokens_per_s": self.tokens / self.seconds,
            "kept": self.kept,
            "moved": self.moved,
            "prefix_hit": self.prefix_hit,
            "shares": [round(s / total, 3) for s in self.shares],
            "client_lag_p99_ms": float(lag),
            "valid": bool(lag <= 10.0),
        }


async def _session(
    engine,
    index: int,
    args,
    deadline: float,
    counted_from: float,
    out: list[float],
    tokens: list[int],
    rng: random.Random,
    pause: Callable[[float], Awaitable[None]],
) -> None:
    history: list[ChatMessage] = []
    turn = 0
    cycle = args.think + (args.new / args.listen if args.listen > 0 else 0.0)
    await pause(rng.uniform(0, cycle))  # sessions start spread over a turn's cycle
    loop = asyncio.get_running_loop()
    while loop.time() < deadline:
        await pause(rng.uniform(0.5, 1.5) * args.think)
        if loop.time() >= deadline:
            return
        question = f"{rng.choice(VOICE_PROMPTS)} (caller {index}, turn {turn})"
        messages = [ChatMessage("system", SYSTEM), *history[-8:], ChatMessage("user", question)]
        request = GenerationRequest(
            f"b{index}-{turn}", messages, args.new, session_id=f"s{index}", ignore_eos=True
        )
        counted = loop.time() >= counted_from
        t0 = time.perf_counter_ns()
        first = None
        parts = []
        async for ev in engine.submit(request):
            if ev.finish_reason is not None:
                if ev.finish_reason == "error":
                    raise RuntimeError(f"request failed: {ev.error}")
                break
            if first is None:
                first = time.perf_counter_ns()
            parts.append(ev.text)
        if counted and first is not None:
            out.append((first - t0) / 1e6)
            tokens[0] += len(parts)
        history += [ChatMessage("user", question), ChatMessage("assistant", "".join(parts)[:400])]
        turn += 1
        if args.listen > 0:  # the reply, spoken; the caller answers after hearing it
            await pause(len(parts) / args.listen)


async def _lag(stop: asyncio.Event, out: list[float], period_s: float = 0.01) -> None:
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        t0 = loop.time()
        await asyncio.sleep(period_s)
        out.append(max(loop.time() - t0 - period_s, 0.0) * 1000)


async def run_level(
    engine,
    gpus: int,
    sessions: int,
    args,
    pause: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> Level:
    """One level: ``sessions`` simulated callers on ``engine`` for ``args.duration`` seconds
    after ``args.warmup``. ``pause``: how a caller waits (thinking, listening to a reply);
    tests pass a recorder, so no other sleeper in the process is touched."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    counted_from = start + args.warmup
    deadline = counted_from + args.duration
    ttft: list[float] = []
    tokens = [0]
    lag: list[float] = []
    stop = asyncio.Event()
    before = engine.stats().extra
    shares_before = _shares(engine)
    lag_task = asyncio.ensure_future(_lag(stop, lag))
    rng = random.Random(sessions * 7919 + gpus)
    await asyncio.gather(
        *(
            _session(
                engine,
                i,
                args,
                deadline,
                counted_from,
                ttft,
                tokens,
                random.Random(rng.random()),
                pause,
            )
            for i in range(sessions)
        )
    )
    stop.set()
    await lag_task
    after = engine.stats().extra
    shares = [a - b for a, b in zip(_shares(engine), shares_before)]
    return Level(
        gpus,
        sessions,
        ttft,
        tokens[0],
        args.duration,
        lag,
        shares,
        after.get("placement_kept", 0) - before.get("placement_kept", 0),
        after.get("placement_moved", 0) - before.get("placement_moved", 0),
        after.get("prefix_hit_ratio", float("nan")),
    )


def _shares(engine) -> list[int]:
    replicas = engine.replicas if isinstance(engine, ReplicaEngine) else [engine]
    return [r.stats().submitted for r in replicas]


def build(model_dir: str, gpus: int, config: str | None, overrides: dict[str, str] | None = None):
    """The engine a config builds for ``model_dir`` on ``gpus`` GPUs, in processes of their own,
    ``overrides`` (config keys) applied last."""
    from voicert.config import load_config
    from voicert.engine.factory import build_engine

    cfg = load_config(
        config,
        {
            "models.llm": model_dir,
            "llm.gpus": str(gpus),
            "llm.process": "true",
            "llm.max_batch": "256",
            **(overrides or {}),
        },
        environ={},
    )
    return build_engine(cfg)[1]


def capacity(rows: list[dict], bar_ms: float) -> str:
    """One line per GPU count: the most sessions whose TTFT P99 was within ``bar_ms`` (levels of
    a client-bound run not counted), and the first level above them that was not."""
    out = []
    for gpus in sorted({r["gpus"] for r in rows}):
        levels = sorted((r for r in rows if r["gpus"] == gpus), key=lambda r: r["sessions"])
        met = [r for r in levels if r["valid"] and r["ttft_p99"] <= bar_ms]
        best = max((r["sessions"] for r in met), default=0)
        over = [r for r in levels if r["sessions"] > best and r["ttft_p99"] > bar_ms]
        past = f"; {over[0]['sessions']} gave {over[0]['ttft_p99']:.1f} ms" if over else ""
        out.append(f"- {gpus} GPU(s): {best} sessions within P99 TTFT <= {bar_ms:g} ms{past}")
    return "\n".join(out)


def render(rows: list[dict], label: str) -> str:
    out = [
        f"Engine replicas, {label}",
        "",
        "| GPUs | placement | sessions | turns | TTFT P50 | P95 | P99 (ms) | tokens/s "
        "| kept / moved | replica shares | prefix hit | client lag P99 |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---|---|---:|---:|",
    ]
    for r in rows:
        mark = "" if r["valid"] else " (client-bound: invalid)"
        placement = (
            "-" if r["gpus"] == 1 else ("affinity" if r.get("affinity", True) else "load only")
        )
        if r.get("remote"):
            placement = "remote (OpenAI API)"
        out.append(
            f"| {r['gpus']} | {placement} | {r['sessions']} | {r['turns']} | {r['ttft_p50']:.1f} | "
            f"{r['ttft_p95']:.1f} | {r['ttft_p99']:.1f} | {r['tokens_per_s']:.0f} | "
            f"{r['kept']:.0f} / {r['moved']:.0f} | "
            f"{' / '.join(f'{s:.2f}' for s in r['shares'])} | {r['prefix_hit']:.2f} | "
            f"{r['client_lag_p99_ms']:.1f}{mark} |"
        )
    return "\n".join(out)


def build_remote(url: str, extra: dict):
    """The LLM stage as a client of an OpenAI-compatible server (the server's only model)."""
    from voicert.config import LlmConfig
    from voicert.engine.clients.openai_compat import OpenAICompatEngine, resolve_model

    cfg = LlmConfig(
        engine="openai",
        base_url=url,
        extra=extra,
        max_context_tokens=4096,
        first_token_timeout_s=60,
        stall_timeout_s=60,
        retries=0,
    )
    return OpenAICompatEngine(cfg, resolve_model(cfg))


async def main_async(args) -> list[dict]:
    rows = []
    if args.remote:
        engine = await asyncio.to_thread(build_remote, args.remote, json.loads(args.remote_extra))
        try:
            for sessions in args.sessions:
                row = (await run_level(engine, 1, sessions, args)).row()
                row["remote"] = args.remote
                print(json.dumps(row), file=sys.stderr, flush=True)
                rows.append(row)
        finally:
            engine.close()
    for gpus in args.gpus:
        levels = [s * gpus for s in args.sessions]
        t0 = time.perf_counter()
        engine = await asyncio.to_thread(build, args.model, gpus, args.config, args.overrides)
        print(
            f"# {gpus} GPU(s): engines up in {time.perf_counter() - t0:.0f} s",
            file=sys.stderr,
            flush=True,
        )
        try:
            variants = [True, False] if gpus > 1 and args.compare_affinity else [True]
            for affinity in variants:
                if gpus > 1:
                    engine.placement = Placement(gpus, affinity=affinity)
                for sessions in levels:
                    row = (await run_level(engine, gpus, sessions, args)).row()
                    row["affinity"] = affinity
                    print(json.dumps(row), file=sys.stderr, flush=True)
                    rows.append(row)
        finally:
            engine.close()
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m voicert.bench.replicas",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "--model", required=True, help="HF checkpoint dir (or anything models.llm takes)"
    )
    ap.add_argument("--label", default="", help="what the model is (say 'random weights')")
    ap.add_argument("--config", default="configs/gpu.yaml")
    ap.add_argument("--gpus", default="1,2", help="GPU counts to run, each in turn")
    ap.add_argument(
        "--sessions",
        default="64,128,256",
        help="sessions per level per GPU (N GPUs run N times as many)",
    )
    ap.add_argument("--think", type=float, default=3.0, help="mean seconds between turns")
    ap.add_argument("--new", type=int, default=48, help="tokens per reply")
    ap.add_argument("--duration", type=float, default=20.0, help="counted seconds per level")
    ap.add_argument("--warmup", type=float, default=6.0, help="uncounted seconds per level")
    ap.add_argument(
        "--compare-affinity",
        action="store_true",
        help="also run each multi-GPU level with placement by load alone",
    )
    ap.add_argument(
        "--remote",
        default="",
        help="also run the levels (one GPU's) through the "
        "LLM stage's client of this OpenAI-compatible server (e.g. vLLM's /v1)",
    )
    ap.add_argument(
        "--remote-extra",
        default='{"ignore_eos": true}',
        help="request fields for the remote server (JSON)",
    )
    ap.add_argument(
        "--listen",
        type=float,
        default=0.0,
        help="tokens a second at which the caller hears each reply before talking again (0: not)",
    )
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an engine config override, e.g. llm.int4=true (repeatable)",
    )
    ap.add_argument(
        "--p99-bar", type=float, default=0.0, help="also print the most sessions within this P99"
    )
    ap.add_argument("--json", action="store_true", help="print the rows as JSON, not a table")
    args = ap.parse_args(argv)
    if any("=" not in kv for kv in args.set):
        ap.error("--set takes KEY=VALUE")
    args.overrides = dict(kv.split("=", 1) for kv in args.set)
    args.gpus = [int(g) for g in args.gpus.split(",") if g]
    args.sessions = [int(s) for s in args.sessions.split(",")]
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    rows = asyncio.run(main_async(args))
    print(json.dumps(rows) if args.json else render(rows, args.label or args.model))
    if args.p99_bar > 0:
        print("\n" + capacity(rows, args.p99_bar))
    return 0


if __name__ == "__main__":
    sys.exit(main())
