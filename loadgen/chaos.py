"""``python -m loadgen --chaos``: callers talk while the server is attacked and broken.

While the closed-loop callers run, every ``--chaos-every`` seconds one action hits the server, in
turn: kill the engine process (``SIGKILL``; needs ``llm.process: true`` on the server and the
server on this machine: its pid comes from ``voicert_engine_pid`` on ``/metrics``), drop a
connection mid-turn without a close, and send a hostile message on one of the doors (malformed,
type-confused, deeply nested, oversized, an unauthenticated Twilio ``start`` with a number for a
prompt). Each hostile message must be answered (a typed error, or a close with a code) and never
take anything else down.

Each kill counts against the server's ``llm.restart_max`` within ``llm.restart_window_s`` (past
it the server gives up and exits, by design): keep ``duration / (3 * chaos-every)`` below it, or
raise it for the run. The report: turns completed; turns that failed with a typed error (those in flight at a kill, and
those asked while the engine was restarting); turns *lost* (no answer: a timeout, or a session
dropped); hostile messages left unanswered; the server's memory and open files before and after.
Target: no lost turns and no unanswered hostile message.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import time
import urllib.request
from dataclasses import dataclass, field

from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake

from loadgen.caller import CallerStats
from loadgen.probe import metrics_url
from loadgen.run import LoadSpec, closed_loop
from voicert.audio.pcm import encode_pcm16
from voicert.protocol import native as p
from voicert.protocol import twilio as tw

DEEP = "[" * 30_000 + "]" * 30_000


def _door(url: str, path: str) -> str:
    scheme, rest = url.split("://", 1)
    return f"{scheme}://{rest.split('/', 1)[0]}{path}"


# (door path, frames to send): each must get an error event or a close with a code
HOSTILE: list[tuple[str, list[str | bytes]]] = [
    ("/v1/stream", [b"\xc1\x00\xffnot msgpack"]),
    ("/v1/stream", [DEEP]),
    ("/v1/stream", [json.dumps({"type": "session.start", "sample_rate": "fast"})]),
    (
        "/v1/stream",
        [
            json.dumps({"type": "session.start"}),
            json.dumps({"type": "user.text", "text": "x" * 100_000}),
        ],
    ),
    (
        "/v1/realtime",
        [
            json.dumps(
                {
                    "type": "session.update",
                    "session": {"turn_detection": {"type": "server_vad", "threshold": "abc"}},
                }
            )
        ],
    ),
    ("/v1/realtime", [json.dumps({"type": "session.update", "session": {"audio": {"input": 5}}})]),
    ("/v1/realtime", [DEEP]),
    (
        "/v1/realtime",
        [
            json.dumps(
                {
                    "type": "conversation.item.create",
                    "item": {
                        "type": "message",
                        "role": "user",
                        "content": [{"type": "input_text", "text": 5}],
                    },
                }
            )
        ],
    ),
    (
        "/twilio",
        [
            tw.InboundWriter(
                "MZchaos", "CAchaos", custom_parameters={"system_prompt": 123}
            ).start(),  # type: ignore[dict-item]
            tw.InboundWriter("MZchaos", "CAchaos").media(b"\xff" * 160, 20),
        ],
    ),
    (
        "/twilio",
        [
            json.dumps({"event": "start", "start": {"customParameters": "abc", "mediaFormat": {}}}),
            tw.InboundWriter("MZchaos", "CAchaos").media(b"\xff" * 160, 20),
        ],
    ),
]


@dataclass
class ChaosLog:
    kills: int = 0
    kills_skipped: str = ""  # why engine kills could not be done, if they could not
    drops: int = 0
    hostile_sent: int = 0
    hostile_unanswered: list[str] = field(default_factory=list)
    memory_before: dict[str, float] = field(default_factory=dict)
    memory_after: dict[str, float] = field(default_factory=dict)


def process_figures(url: str) -> dict[str, float]:
    """The server's RSS, open files and engine pid from /metrics ({} if unreachable)."""
    try:
        with urllib.request.urlopen(metrics_url(url), timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return {}
    out = {}
    for line in text.splitlines():
        for name in (
            "process_resident_memory_bytes",
            "process_open_fds",
            "voicert_engine_pid",
            "voicert_engine_up",
        ):
            if line.startswith(name + " "):
                out[name] = float(line.split()[1])
    return out


async def kill_engine(url: str, log: ChaosLog) -> None:
    pid = int(process_figures(url).get("voicert_engine_pid", 0))
    if pid <= 0:
        log.kills_skipped = "the engine runs inside the server (start it with llm.process=true)"
        return
    try:
        os.kill(pid, signal.SIGKILL)
        log.kills += 1
    except (ProcessLookupError, PermissionError) as exc:
        log.kills_skipped = f"cannot kill engine pid {pid}: {exc} (server on another machine?)"


async def drop_connection(url: str, clip, log: ChaosLog) -> None:
    samples, rate = clip
    for _ in range(60):  # while the engine restarts new sockets are refused: try again
        try:
            ws = await connect(url, open_timeout=10)
            break
        except (OSError, InvalidHandshake):
            await asyncio.sleep(0.5)
    else:
        return
    await ws.send(p.encode(p.SessionStart(sample_rate=rate)))
    n = rate // 50
    for i in range(0, samples.size // 2, n):  # half an utterance, then vanish mid-turn
        await ws.send(p.encode(p.Audio(encode_pcm16(samples[i : i + n]))))
    ws.transport.abort()
    log.drops += 1


async def hostile(url: str, door: str, frames: list, log: ChaosLog) -> None:
    log.hostile_sent += 1
    target = _door(url, door)
    try:
        async with connect(target, open_timeout=10, max_size=None) as ws:
            for frame in frames:
                await ws.send(frame)
            while True:  # answered: an error event, or the server closing with a code
                msg = await asyncio.wait_for(ws.recv(), 30)
                if '"error"' in str(msg) or (isinstance(msg, bytes) and b"error" in msg):
                    return
    except ConnectionClosed as exc:
        if exc.rcvd is not None:
            return
        log.hostile_unanswered.append(f"{door}: closed without a code")
    except (OSError, InvalidHandshake):
        return  # refused at the door (503 while restarting): answered
    except TimeoutError:
        log.hostile_unanswered.append(f"{door}: no answer within 30 s to {str(frames[-1])[:60]}")


async def chaos_loop(
    spec: LoadSpec, every_s: float, stop_at: float, log: ChaosLog, rng: random.Random
) -> None:
    step = 0
    while True:
        await asyncio.sleep(every_s)
        if time.monotonic() >= stop_at - every_s / 2:
            return
        action = step % 3
        step += 1
        if action == 0:
            await kill_engine(spec.url, log)
        elif action == 1:
            await drop_connection(spec.url, rng.choice(spec.clips), log)
        else:
            for door, frames in rng.sample(HOSTILE, 3):
                await hostile(spec.url, door, frames, log)


async def run(spec: LoadSpec, callers: int, every_s: float) -> tuple[CallerStats, ChaosLog]:
    log = ChaosLog(memory_before=process_figures(spec.url))
    stop_at = time.monotonic() + spec.ramp_s + spec.duration_s
    chaos = asyncio.ensure_future(chaos_loop(spec, every_s, stop_at, log, random.Random(spec.seed)))
    try:
        stats = await closed_loop(spec, callers)
    finally:
        chaos.cancel()
        await asyncio.gather(chaos, return_exceptions=True)
    for _ in range(60):  # let a last restart finish before reading the server's figures
        figures = process_figures(spec.url)
        if figures.get("voicert_engine_up", 1.0) >= 1.0:
            break
        await asyncio.sleep(1)
    log.memory_after = figures
    return stats, log


def report(stats: CallerStats, log: ChaosLog) -> tuple[str, bool]:
    """The chaos report (Markdown) and whether it met the target."""
    done = sum(1 for t in stats.turns if t.finish_reason in ("stop", "length"))
    failed = sum(1 for t in stats.turns if t.finish_reason == "error")
    lost = stats.timeouts + stats.dropped
    mb = lambda d: d.get("process_resident_memory_bytes", 0) / 2**20
    lines = [
        "| what | count |",
        "|---|---:|",
        f"| turns answered | {done} |",
        f"| turns failed with a typed error (in flight at a kill, or while restarting) | {failed} |",
        f"| turns lost (no answer: timeouts + dropped sessions) | {lost} |",
        f"| sessions refused at the door (503 while restarting, limits) | {stats.refused} |",
        f"| session attempts that found no server (it exited) | {stats.unreachable} |",
        f"| error events received by callers | {stats.errors} |",
        f"| engine kills | {log.kills}{' (skipped: ' + log.kills_skipped + ')' if log.kills_skipped else ''} |",
        f"| connections dropped mid-turn | {log.drops} |",
        f"| hostile messages sent / unanswered | {log.hostile_sent} / {len(log.hostile_unanswered)} |",
        f"| server RSS before / after (MiB) | {mb(log.memory_before):.0f} / {mb(log.memory_after):.0f} |",
        f"| server open files before / after | {log.memory_before.get('process_open_fds', 0):.0f}"
        f" / {log.memory_after.get('process_open_fds', 0):.0f} |",
    ]
    for problem in log.hostile_unanswered:
        lines.append(f"\nunanswered: {problem}")
    ok = lost == 0 and not log.hostile_unanswered and done > 0 and not stats.unreachable
    lines.append(
        f"\ntarget (no lost turn, every hostile message answered): {'met' if ok else 'NOT met'}"
    )
    return "\n".join(lines), ok
