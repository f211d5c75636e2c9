"""Results: a JSON document, a Markdown table and PNG plots (matplotlib, headless)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from loadgen.caller import MAX_VALID_SLIP_MS, CallerStats
from voicert.telemetry.latency import STAGE_COLOURS, WATERFALL

MIN_TURNS_FOR_P99 = 100  # below this, a P99 is little more than the largest sample
# the server's voice_to_first_token_ms and the callers' client_v2ft_ms measure one interval; at
# P50 they may differ by the wire and the reader, at most this much, before a level is suspect
AGREE_MS, AGREE_FRACTION = 60.0, 0.15
ROWS = (
    "endpoint_ms",
    "ingest_ms",
    "decide_ms",
    "asr_ms",
    "asr_wait_ms",
    "asr_decode_ms",
    "dispatch_ms",
    "queue_ms",
    "prefill_ms",
    "handoff_ms",
    "first_token_ms",
    "send_ms",
    "ttft_ms",
    "voice_to_first_token_ms",
    "client_v2ft_ms",
    "tts_ms",
    "tts_wait_ms",
    "tts_synth_ms",
    "tts_out_ms",
    "ttfa_ms",
    "token_to_audio_ms",
    "client_ttft_ms",
    "client_endpoint_ttft_ms",
    "client_extra_ms",
    "client_ttfa_ms",
    "client_done_ms",
)


def values(stats: CallerStats, name: str) -> list[float]:
    if name.startswith("client_"):
        return [v for t in stats.turns if (v := getattr(t, name)) is not None]
    return [t.stages[name] for t in stats.turns if name in t.stages]


def pcts(xs: list[float]) -> dict[str, float]:
    a = np.asarray(xs, dtype=np.float64)
    return {
        "p50": float(np.percentile(a, 50)),
        "p95": float(np.percentile(a, 95)),
        "p99": float(np.percentile(a, 99)),
        "n": int(a.size),
    }


def agreement(stats: CallerStats) -> tuple[float, float] | None:
    """(server voice_to_first_token_ms P50, client_v2ft_ms P50) over the turns that have both;
    None when none has."""
    pairs = [
        (t.stages["voice_to_first_token_ms"], t.client_v2ft_ms)
        for t in stats.turns
        if "voice_to_first_token_ms" in t.stages and t.client_v2ft_ms is not None
    ]
    if not pairs:
        return None
    server, client = np.percentile(np.asarray(pairs, np.float64), 50, axis=0)
    return float(server), float(client)


def agree(server_ms: float, client_ms: float) -> bool:
    """Whether the server's P50 is within max(AGREE_MS, AGREE_FRACTION) of the callers'."""
    return abs(server_ms - client_ms) <= max(AGREE_MS, AGREE_FRACTION * client_ms)


def misses(
    stats: CallerStats, budget_ms: float, max_slip_ms: float = MAX_VALID_SLIP_MS
) -> list[str]:
    """Why a level does not hold the budget, in words; empty when it holds: turns, the server's
    P99 TTFT within ``budget_ms``, no refused, unreachable or dropped session, no error or
    timeout, the server's voice-to-first-token agreeing with the callers', and a generator that
    kept its schedule (frames at most ``max_slip_ms`` late at P99)."""
    ttfts = values(stats, "ttft_ms")
    if not ttfts:
        return ["no turns"]
    why = []
    p99 = float(np.percentile(ttfts, 99))
    if p99 > budget_ms:
        why.append(f"P99 TTFT {p99:.0f} ms")
    for name in ("refused", "unreachable", "dropped", "errors", "timeouts"):
        if count := getattr(stats, name):
            why.append(f"{count} {name}")
    both = agreement(stats)
    if both is not None and not agree(*both):
        why.append(f"server V2FT P50 {both[0]:.0f} ms against the callers' {both[1]:.0f}")
    if stats.slip.percentile(99) > max_slip_ms:
        why.append("the load generator fell behind")
    return why


def summarize(levels: dict[int, CallerStats], budget_ms: float) -> dict:
    out = {}
    for n, stats in sorted(levels.items()):
        both = agreement(stats)
        why = misses(stats, budget_ms)
        out[str(n)] = {
            "turns": len(stats.turns),
            "sessions": stats.sessions,
            "refused": stats.refused,
            "unreachable": stats.unreachable,
            "errors": stats.errors,
            "timeouts": stats.timeouts,
            "dropped": stats.dropped,
            "holds": not why,
            "misses": why,
            "v2ft_p50_ms": None if both is None else {"server": both[0], "client": both[1]},
            "stages": {name: pcts(v) for name in ROWS if (v := values(stats, name))},
            "server": stats.server,
            "loadgen_slip_ms": {
                "p50": stats.slip.percentile(50),
                "p99": stats.slip.percentile(99),
                "max": stats.slip.percentile(100),
                "frames": stats.slip.n,
            },
            "valid": stats.slip.percentile(99) <= MAX_VALID_SLIP_MS,
        }
        p99 = {k: q["p99"] for k, q in out[str(n)]["stages"].items() if k in WATERFALL}
        out[str(n)]["dominant_p99"] = max(p99, key=p99.get) if p99 else None
    return out


def no_turns(summary: dict) -> str | None:
    """One line for a run in which no turn completed (None when some did)."""
    if any(s["turns"] for s in summary.values()):
        return None
    total = {k: sum(s[k] for s in summary.values()) for k in COUNTS}
    said = ", ".join(f"{v} {k}" for k, v in total.items() if v and k != "sessions")
    return (
        f"No turn completed: {total['sessions']} session(s) tried"
        + (f", {said}" if said else "")
        + ". Is the server up and answering (its log, /readyz)?"
    )


COUNTS = ("sessions", "refused", "unreachable", "errors", "timeouts", "dropped")


def markdown(summary: dict, budget_ms: float, best: int | None, title: str) -> str:
    lines = [f"### {title}", ""]
    if (nothing := no_turns(summary)) is not None:
        return "\n".join([*lines, nothing])
    lines += [
        f"Budget: P99 TTFT <= {budget_ms:g} ms, no refusal, error, timeout or drop, and the "
        f"server's voice-to-first-token P50 within max({AGREE_MS:g} ms, "
        f"{AGREE_FRACTION:.0%}) of the callers'. Largest concurrency that held it: "
        f"{best if best is not None else 'none'}.",
        "",
        "| sessions | holds | tried | refused | unreachable | errors | timeouts | dropped "
        "| V2FT P50 server / client ms |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for level, s in summary.items():
        v2ft = s.get("v2ft_p50_ms")
        pair = "-" if v2ft is None else f"{v2ft['server']:.0f} / {v2ft['client']:.0f}"
        verdict = "yes" if s["holds"] else "no: " + "; ".join(s["misses"])
        lines.append(
            f"| {level} | {verdict} | {s['sessions']} | {s['refused']} | {s['unreachable']} "
            f"| {s['errors']} | {s['timeouts']} | {s['dropped']} | {pair} |"
        )
    lines += [
        "",
        "| sessions | turns | stage | P50 ms | P95 ms | P99 ms |",
        "|---:|---:|---|---:|---:|---:|",
    ]
    for level, s in summary.items():
        if not s["stages"]:
            lines.append(f"| {level} | 0 | no turn completed | | | |")
        first = True
        for name, q in s["stages"].items():
            head = f"| {level} | {s['turns']} " if first else "| | "
            few = "*" if q["n"] < MIN_TURNS_FOR_P99 else ""
            lines.append(
                f"{head}| {name} | {q['p50']:.1f} | {q['p95']:.1f} | {q['p99']:.1f}{few} |"
            )
            first = False
    if any(q["n"] < MIN_TURNS_FOR_P99 for s in summary.values() for q in s["stages"].values()):
        lines += [
            "",
            f"\\* fewer than {MIN_TURNS_FOR_P99} turns: that P99 is close to the "
            f"largest value seen, not a P99 (run longer or with more sessions).",
        ]
    slips = ", ".join(
        f"{level} sessions: P99 {s['loadgen_slip_ms']['p99']:.1f} ms"
        + ("" if s.get("valid", True) else " INVALID")
        for level, s in summary.items()
        if "loadgen_slip_ms" in s
    )
    lines += [
        "",
        f"Load generator schedule slip (how late its audio frames left; a level over "
        f"{MAX_VALID_SLIP_MS:g} ms at P99 measured the generator, not the server): {slips}.",
    ]
    dominant = [
        f"{level} sessions: {s['dominant_p99']}"
        for level, s in summary.items()
        if s.get("dominant_p99")
    ]
    if dominant:
        lines += ["", "Dominant waterfall stage at P99: " + ", ".join(dominant) + "."]
    servers = {level: s["server"] for level, s in summary.items() if s.get("server")}
    if servers:
        keys = (
            "server_cores",
            "engine_batch_mean",
            "asr_batch_mean",
            "prefix_hit_ratio",
            "gpu_util_mean",
            "gpu_util_max",
            "gpu_mem_max_mib",
            "prefill_step_ms_mean",
            "prefill_step_ms_p99_le",
            "decode_step_ms_mean",
            "decode_step_ms_p99_le",
            "gc_server_count",
            "gc_server_ms_total",
            "gc_server_ms_max_le",
            "gc_engine_count",
            "gc_engine_ms_total",
            "gc_engine_ms_max_le",
            "loop_lag_server_ms_p99_le",
            "loop_lag_server_ms_max_le",
        )
        lines += ["", "| sessions | " + " | ".join(keys) + " |", "|---:|" + "---:|" * len(keys)]
        for level, srv in servers.items():
            lines.append(
                f"| {level} | "
                + " | ".join(f"{srv[k]:.2f}" if k in srv else "-" for k in keys)
                + " |"
            )
    return "\n".join(lines)


def plots(levels: dict[int, CallerStats], out_dir: Path, budget_ms: float) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    files = []
    fig, ax = plt.subplots(figsize=(8.5, 4.5))
    for i, (n, stats) in enumerate(sorted(levels.items())):
        for name, style in (("voice_to_first_token_ms", "-"), ("client_v2ft_ms", ":")):
            xs = np.sort(values(stats, name))
            if xs.size:  # one colour per level: solid the server's figure, dotted the client's
                ax.plot(
                    xs,
                    np.arange(1, xs.size + 1) / xs.size,
                    style,
                    color=f"C{i % 10}",
                    label=f"{n} sessions, {'client' if name.startswith('client') else 'server'}",
                )
    ax.set_xlabel("last voiced audio -> first token (ms)")
    ax.set_ylabel("fraction of turns")
    ax.set_title("Voice to first token by concurrency: the server's clock and the callers'")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    ax.grid(alpha=0.3)
    files.append(out_dir / "v2ft_cdf.png")
    fig.tight_layout()
    fig.savefig(files[-1], dpi=110, bbox_inches="tight")
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(8.5, 4.5))
    names = sorted(levels)
    bottom = np.zeros(len(names))
    for stage in WATERFALL:
        p50 = np.array(
            [np.percentile(v, 50) if (v := values(levels[n], stage)) else 0.0 for n in names]
        )
        ax.bar(
            [str(n) for n in names],
            p50,
            bottom=bottom,
            label=stage.removesuffix("_ms"),
            color=STAGE_COLOURS[stage],
        )
        bottom += p50
    ax.set_xlabel("concurrent sessions")
    ax.set_ylabel("P50 ms (stacked, last voice -> first token)")
    ax.set_title("Where the time goes, by concurrency")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    files.append(out_dir / "stages_by_concurrency.png")
    fig.tight_layout()
    fig.savefig(files[-1], dpi=110, bbox_inches="tight")
    plt.close(fig)
    return files


def write_json_and_markdown(
    levels: dict[int, CallerStats],
    out_dir: Path,
    budget_ms: float,
    best: int | None,
    title: str,
    meta: dict,
) -> None:
    """``result.json`` and ``report.md`` for the levels given (no plots: cheap after each level)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = summarize(levels, budget_ms)
    (out_dir / "result.json").write_text(
        json.dumps(
            {
                "meta": meta,
                "budget_ms": budget_ms,
                "largest_holding_budget": best,
                "levels": summary,
            },
            indent=1,
        )
    )
    md = markdown(summary, budget_ms, best, title)
    (out_dir / "report.md").write_text(md + "\n")


class LevelWriter:
    """A sweep's report on disk after every level (``result.json`` with ``meta.partial`` and
    ``report.md``, no plots), so a sweep cut short keeps the levels it finished."""

    def __init__(self, out_dir: Path, budget_ms: float, title: str, meta: dict) -> None:
        self.out_dir, self.budget_ms, self.title = out_dir, budget_ms, title
        self.meta = {**meta, "partial": True}
        self.levels: dict[int, CallerStats] = {}
        self.best: int | None = None

    def add(self, n: int, stats: CallerStats, held: bool) -> None:
        self.levels[n] = stats
        if held:
            self.best = n if self.best is None else max(self.best, n)
        write_json_and_markdown(
            self.levels, self.out_dir, self.budget_ms, self.best, self.title, self.meta
        )


def write_all(
    levels: dict[int, CallerStats],
    out_dir: Path,
    budget_ms: float,
    best: int | None,
    title: str,
    meta: dict,
) -> dict[str, Path]:
    write_json_and_markdown(levels, out_dir, budget_ms, best, title, meta)
    pngs = []
    if any(stats.turns for stats in levels.values()):  # no empty plots of a failed run
        try:
            pngs = plots(levels, out_dir, budget_ms)
        except ImportError:  # matplotlib is optional (the loadgen extra): JSON and Markdown stand
            pass
    return {
        "json": out_dir / "result.json",
        "markdown": out_dir / "report.md",
        **{p.stem: p for p in pngs},
    }
