"""The live dashboard: static files from ``web/`` and a WebSocket feed of turns and system samples.

Feed messages (JSON text frames): ``snapshot`` once (budget, waterfall stage names, recent turns),
then ``turn`` for every finished turn and ``system`` once a second (sessions, engine queue, mean
batch size, event-loop lag; from the server's one sampler, telemetry/sampler.py). A dashboard
that cannot keep up loses turns, never slows a session down. The feed takes no messages: one
sent closes the socket with 1003."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed

from voicert.agent.session import Services
from voicert.server.connection import CLOSE_UNSUPPORTED_DATA
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
    "/app.css": ("app.css", "text/css; charset=utf-8"),
    "/dashboard.css": ("dashboard.css", "text/css; charset=utf-8"),
}
# The pages hold a token (the settings panel, the dashboard's feed) and the microphone: no inline
# script or style runs (every string from the server or a caller is text: a markup one injected
# would still not run), no other site may frame them (clickjacking Start), nothing is sniffed.
# They connect to the server the settings name, which may be another host.
PAGE_HEADERS = [
    (
        "Content-Security-Policy",
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self' ws: wss: http: https:; media-src 'self' blob:; worker-src 'self'; "
        "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
    ),
    ("X-Frame-Options", "DENY"),
    ("X-Content-Type-Options", "nosniff"),
    ("Referrer-Policy", "no-referrer"),
]
ASSET_HEADERS = [("X-Content-Type-Options", "nosniff")]
FEED_PATH = "/v1/dashboard"


def static_file(
    path: str, web_dir: Path = WEB_DIR
) -> tuple[bytes, str, list[tuple[str, str]]] | None:
    """(body, content type, headers) for a static route (the browser client and the dashboard),
    or None. Pages carry :data:`PAGE_HEADERS`, their scripts and styles ``nosniff``."""
    entry = STATIC.get(path)
    if entry is None:
        return None
    headers = PAGE_HEADERS if entry[1].startswith("text/html") else ASSET_HEADERS
    return (web_dir / entry[0]).read_bytes(), entry[1], list(headers)


async def feed(ws: ServerConnection, svc: Services, sampler: Sampler) -> None:
    """One dashboard: a snapshot, then every finished turn and every system sample, until the
    dashboard leaves. The feed takes no messages: one sent is answered by a close with 1003
    (unsupported data), never left unread (unread frames would stop the socket's reading,
    its close handshake included)."""
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
    reader = asyncio.ensure_future(_refuse_messages(ws))
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
        while (msg := await _next_or_gone(queue, reader)) is not None:
            await ws.send(json.dumps(msg))
    except ConnectionClosed:
        pass
    finally:
        reader.cancel()
        m.listeners.discard(on_turn)
        sampler.listeners.discard(on_sample)


async def _next_or_gone(queue: asyncio.Queue[dict], reader: asyncio.Future) -> dict | None:
    """The feed's next message, or None once the dashboard has left (``reader`` ended): a
    dashboard that leaves between messages is let go at once, not at the next message, which
    may never come (a server shutting down waits for every connection's handler)."""
    get = asyncio.ensure_future(queue.get())
    await asyncio.wait({get, reader}, return_when=asyncio.FIRST_COMPLETED)
    if get.done():
        return get.result()
    get.cancel()
    return None


async def _refuse_messages(ws: ServerConnection) -> None:
    """Read the dashboard's socket until it closes; close it with 1003 on any message."""
    try:
        async for _ in ws:
            log.info("a dashboard sent a message: closed (the feed takes none)")
            await ws.close(CLOSE_UNSUPPORTED_DATA, "the dashboard feed takes no messages")
            return
    except ConnectionClosed:
        pass
