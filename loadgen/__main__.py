"""``python -m loadgen``: simulated callers streaming real speech WAVs to a voicert server.

Modes: ``--callers N`` (closed loop), ``--arrival-rate R`` (open loop, Poisson sessions/s), or
``--sweep 1,2,4,8`` (closed loop at each level; reports the largest level that holds the budget).
Writes result.json, report.md and PNG plots to ``--out``."""

from __future__ import annotations

import argparse
import asyncio
import glob
import sys
import time
from pathlib import Path

from loadgen.caller import CallerStats
from loadgen.probe import BUDGET_GAUGE, metrics_url, scrape_budget
from loadgen.report import LevelWriter, misses, no_turns, summarize, write_all
from loadgen.run import LoadSpec, closed_loop, open_loop, sweep
from voicert.client import ClientError, load_for_streaming, server_env, stream_url
from voicert.config import TelemetryConfig
from voicert.protocol import native as p

DEFAULT_BUDGET_MS = TelemetryConfig().budget_ms


def by_concurrency(stats: CallerStats) -> dict[int, CallerStats]:
    """Open loop: group turns by the number of sessions open when each began (session-level
    counts stay on the lowest level)."""
    levels: dict[int, CallerStats] = {}
    for turn in stats.turns:
        levels.setdefault(turn.concurrency, CallerStats()).turns.append(turn)
    first = levels.setdefault(min(levels, default=1), CallerStats())
    first.errors, first.timeouts = stats.errors, stats.timeouts
    first.dropped, first.sessions = stats.dropped, stats.sessions
    first.refused, first.unreachable = stats.refused, stats.unreachable
    return levels


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m loadgen", description=__doc__.splitlines()[0])
    ap.add_argument(
        "--url",
        default=server_env(),
        help="the server: ws://HOST:PORT or the stream's URL (default: $VOICERT_URL, "
        "else ws://127.0.0.1:8765)",
    )
    ap.add_argument("--wav", nargs="+", default=sorted(glob.glob("tests/data/*.wav")))
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--callers", type=int, default=1, help="closed loop: concurrent callers")
    mode.add_argument("--arrival-rate", type=float, help="open loop: new sessions per second")
    mode.add_argument("--sweep", help="closed loop at each level, e.g. 1,2,4,8")
    ap.add_argument("--duration", type=float, default=30.0, help="seconds per level (after ramp)")
    ap.add_argument("--ramp", type=float, default=2.0, help="seconds to start all callers")
    ap.add_argument("--turns", type=int, default=3, help="turns per session")
    ap.add_argument("--think", type=float, default=1.0, help="mean pause between turns (s)")
    ap.add_argument("--turn-timeout", type=float, default=30.0)
    ap.add_argument("--max-turns", type=int, default=0, help="stop after this many turns (0: none)")
    ap.add_argument(
        "--budget-ms",
        type=float,
        help="P99 TTFT a level must hold (default: the server's telemetry.budget_ms, read "
        "from its /metrics)",
    )
    ap.add_argument("--out", default="artifacts/loadgen")
    ap.add_argument("--title", default="voicert load")
    ap.add_argument(
        "--procs",
        type=int,
        default=1,
        help="closed loop / sweep: split the callers over this many processes (use "
        "several beyond ~64 sessions: one process falls behind real time)",
    )
    ap.add_argument(
        "--chaos",
        action="store_true",
        help="while the callers talk, kill the engine process, drop connections and "
        "send hostile messages; report lost turns and memory (loadgen/chaos.py)",
    )
    ap.add_argument("--chaos-every", type=float, default=10.0, help="seconds between chaos actions")
    ap.add_argument(
        "--server-pid",
        type=int,
        help="the server's pid on this machine: report the CPU cores its processes "
        "(workers, engine host) used per level",
    )
    ap.add_argument(
        "--speak",
        action="store_true",
        help="ask for spoken replies (pcm16 24 kHz): time to first audio is measured too",
    )
    args = ap.parse_args(argv)
    if not args.wav:
        ap.error("no WAV files (give --wav)")
    try:
        args.url = stream_url(args.url)
    except ClientError as exc:
        ap.error(str(exc))
    spec = LoadSpec(
        args.url,
        [load_for_streaming(w) for w in args.wav],
        args.duration,
        args.ramp,
        args.turns,
        args.think,
        args.turn_timeout,
        max_turns=args.max_turns,
        output_audio=p.OutputAudio("pcm16", 24000) if args.speak else None,
        procs=max(1, args.procs),
        server_pid=args.server_pid,
    )
    if args.budget_ms is None:
        args.budget_ms = server_budget_ms(args.url)
    t0 = time.monotonic()

    so_far = LevelWriter(
        Path(args.out), args.budget_ms, args.title, {"argv": sys.argv[1:] if argv is None else argv}
    )

    def progress(n, stats, held):
        why = misses(stats, args.budget_ms)
        print(
            f"  {n} sessions: {len(stats.turns)} turns, refused={stats.refused} "
            f"unreachable={stats.unreachable} errors={stats.errors} timeouts={stats.timeouts} "
            f"dropped={stats.dropped}: "
            + ("holds the budget" if held else "misses the budget (" + "; ".join(why) + ")"),
            file=sys.stderr,
            flush=True,
        )
        so_far.add(n, stats, held)

    best = None
    if args.chaos:
        from loadgen import chaos

        say(
            f"chaos: {args.callers} callers for {args.duration:g} s, an action every "
            f"{args.chaos_every:g} s"
        )
        stats, log = asyncio.run(chaos.run(spec, args.callers, args.chaos_every))
        text, ok = chaos.report(stats, log)
        print(text)
        return 0 if ok else 1
    per_level = args.ramp + args.duration
    if args.sweep:
        levels_n = [int(x) for x in args.sweep.split(",")]
        say(
            f"sweep: {len(levels_n)} level(s) ({args.sweep} sessions), ~{per_level:g} s each "
            f"plus the last turns' answers; a line as each level ends"
        )
        levels, best = asyncio.run(sweep(spec, levels_n, args.budget_ms, progress))
    elif args.arrival_rate:
        say(f"open loop: {args.arrival_rate:g} new sessions a second for ~{per_level:g} s")
        levels = by_concurrency(asyncio.run(open_loop(spec, args.arrival_rate)))
    else:
        say(f"closed loop: {args.callers} caller(s) for ~{per_level:g} s")
        levels = {args.callers: asyncio.run(closed_loop(spec, args.callers))}
    files = write_all(
        levels,
        Path(args.out),
        args.budget_ms,
        best,
        args.title,
        {"argv": sys.argv[1:] if argv is None else argv, "wall_s": round(time.monotonic() - t0, 1)},
    )
    if not any(stats.turns for stats in levels.values()):
        print(no_turns(summarize(levels, args.budget_ms)))
        return 1
    print(files["markdown"].read_text())
    print("wrote " + ", ".join(str(p) for p in files.values()))
    if not any(p.suffix == ".png" for p in files.values()):
        say("no plots: matplotlib is not installed (pip install -e '.[loadgen]' adds it)")
    return 0


def server_budget_ms(url: str) -> float:
    """The server's TTFT budget from its /metrics; telemetry.budget_ms's default when the
    server does not say (an older server, or none there yet: the run will tell)."""
    budget = scrape_budget(metrics_url(url))
    if budget is None:
        say(
            f"the server's budget is unknown (no {BUDGET_GAUGE} at {metrics_url(url)}): "
            f"using {DEFAULT_BUDGET_MS:g} ms (set it with --budget-ms)"
        )
        return DEFAULT_BUDGET_MS
    say(f"budget: the server's, P99 TTFT <= {budget:g} ms")
    return budget


def say(line: str) -> None:
    """Progress, on stderr (the report goes to stdout)."""
    print(line, file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
