"""The live dashboard: static files from ``web/`` and a WebSocket feed of turns and system samples.

Feed messages (JSON text frames): ``snapshot`` once (budget, waterfall stage names, recent turns),
then ``turn`` for every finished turn and ``system`` once a second (sessions, engine queue, mean
batch size, event-loop lag; from the server's one sampler, telemetry/sampler.py). A dashboard that cannot keep up loses turns, never slows a session down."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed

from voicert.agent.session import Services
from voicert.telemetry.latency import WATERFALL, TurnRecord
from voicert.telemetry.sampler import Sampler, SystemSample

log = logging.getLogger(__name__)
WEB_DIR = Path(__file__).resolve().parents[1] / "web"  # package data: in the wheel too
STATIC = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/capture-worklet.js": ("capture-worklet.js", "text/javascript; charset=utf-8"),
    "/dashboard": ("dashboard.html", "text/html; charset=utf-8"),
    "/dashboard.js": ("dashboard.js", "text/javascript; charset=utf-8"),
}
FEED_PATH = "/v1/dashboard"


def static_file(path: str, web_dir: Path = WEB_DIR) -> tuple[bytes, str] | None:
    """(body, content type) for a static route (the browser client and the dashboard), or None."""
    entry = STATIC.get(path)
    if entry is None:
        return None
    return (web_dir / entry[0]).read_bytes(), entry[1]


async def feed(ws: ServerConnection, svc: Services, sampler: Sampler) -> None:
    """One dashboard: a snapshot, then every finished turn and every system sample."""
    m = svc.metrics
    queue: asyncio.Queue[dict] = asyncio.Queue(maxsize=256)

    def push(msg: dict) -> None:
        try:
            queue.put_nowait(msg)
        except asyncio.QueueFull:
            pass  # this viewer is behind: it misses a message, the session does not wait

    def on_turn(rec: TurnRecord) -> None:
        push({"type": "turn", "turn": rec.as_dict()})

    def on_sample(sample: SystemSample) -> None:
        push(sample.as_dict())

    m.listeners.add(on_turn)
    sampler.listeners.add(on_sample)
    try:
        await ws.send(
            json.dumps(
                {
                    "type": "snapshot",
                    "budget_ms": m.budget_ms,
                    "waterfall": list(WATERFALL),
                    "max_turns": m.recent.maxlen,
                    "turns": [r.as_dict() for r in m.recent],
                }
            )
        )
        while True:
            await ws.send(json.dumps(await queue.get()))
    except ConnectionClosed:
        pass
    finally:
        m.listeners.discard(on_turn)
        sampler.listeners.discard(on_sample)
