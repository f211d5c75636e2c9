"""The live dashboard: static files from ``web/`` and a WebSocket feed of turns and system samples.

Feed messages (JSON text frames): ``snapshot`` once (budget, waterfall stage names, recent turns),
then ``turn`` for every finished turn and ``system`` once a second (sessions, engine queue, mean
batch size). A dashboard that cannot keep up loses turns, never slows a session down."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from pathlib import Path

from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed

from voicert.agent.session import Services
from voicert.telemetry.latency import WATERFALL, TurnRecord

log = logging.getLogger(__name__)
WEB_DIR = Path(__file__).resolve().parents[2] / "web"
STATIC = {"/": ("index.html", "text/html; charset=utf-8"),
          "/app.js": ("app.js", "text/javascript; charset=utf-8"),
          "/capture-worklet.js": ("capture-worklet.js", "text/javascript; charset=utf-8"),
          "/dashboard": ("dashboard.html", "text/html; charset=utf-8"),
          "/dashboard.js": ("dashboard.js", "text/javascript; charset=utf-8")}
FEED_PATH = "/v1/dashboard"
TICK_S = 1.0


def static_file(path: str, web_dir: Path = WEB_DIR) -> tuple[bytes, str] | None:
    """(body, content type) for a static route (the browser client and the dashboard), or None."""
    entry = STATIC.get(path)
    if entry is None:
        return None
    return (web_dir / entry[0]).read_bytes(), entry[1]


async def feed(ws: ServerConnection, svc: Services) -> None:
    m = svc.metrics
    queue: asyncio.Queue[TurnRecord] = asyncio.Queue(maxsize=256)

    def on_turn(rec: TurnRecord) -> None:
        try:
            queue.put_nowait(rec)
        except asyncio.QueueFull:
            pass  # this viewer is behind: it misses a turn, the session does not wait

    m.listeners.add(on_turn)
    try:
        await ws.send(json.dumps({"type": "snapshot", "budget_ms": m.budget_ms,
                                  "waterfall": list(WATERFALL), "max_turns": m.recent.maxlen,
                                  "turns": [r.as_dict() for r in m.recent]}))
        next_tick = time.monotonic()
        while True:
            timeout = max(next_tick - time.monotonic(), 0)
            try:
                rec = await asyncio.wait_for(queue.get(), timeout)
                await ws.send(json.dumps({"type": "turn", "turn": rec.as_dict()}))
                continue
            except asyncio.TimeoutError:
                pass
            steps = m.sample_engine(svc.engine)
            m.sample_asr(svc.asr)
            await ws.send(json.dumps({
                "type": "system", "t": time.time(), "sessions": m.active_sessions,
                "queue_depth": m.queue_depth._value.get(), "running": m.running._value.get(),
                "steps": len(steps),
                "mean_batch": sum(r.batch for r in steps) / len(steps) if steps else 0.0}))
            next_tick += TICK_S
    except ConnectionClosed:
        pass
    finally:
        m.listeners.discard(on_turn)
