"""The server's log of websockets' own events, kept useful under hostile or chatty clients.

websockets logs every failed opening handshake at ERROR with a full traceback, and every HTTP
answer (health polls, static files: "connection rejected (200 OK)") at INFO. An unauthenticated
client could flood the log with tracebacks, and routine polls drown the lines that matter. Here a
failed handshake becomes one WARNING line naming the error (at most one a second; the others are
counted into the next line), and per-request lines go to DEBUG.
"""

from __future__ import annotations

import logging
import time

_ROUTINE = (
    "connection rejected",
    "connection open",
    "connection closed",
    "server listening",
    "server closing",
    "server closed",
)


class _HandshakeFilter(logging.Filter):
    def __init__(self, interval_s: float = 1.0) -> None:
        super().__init__()
        self.interval_s = interval_s
        self._last = float("-inf")
        self._dropped = 0

    def filter(self, record: logging.LogRecord) -> bool:
        msg = str(record.msg)
        if msg.startswith("opening handshake failed"):
            now = time.monotonic()
            if now - self._last < self.interval_s:
                self._dropped += 1
                return False
            self._last = now
            exc = record.exc_info[1] if record.exc_info else None
            cause = exc.__cause__ or exc if exc is not None else None
            detail = f"{type(cause).__name__}: {cause}" if cause is not None else "unknown"
            more = f" (+{self._dropped} more since the last)" if self._dropped else ""
            self._dropped = 0
            record.msg, record.args = "opening handshake failed: %s%s", (detail[:200], more)
            record.exc_info = record.exc_text = None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
            return True
        if record.levelno <= logging.INFO and msg.startswith(_ROUTINE):
            return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)
        return True


def quiet_handshake_logger() -> logging.Logger:
    """The logger to hand websockets' ``serve(logger=...)`` (one per process, filter installed once)."""
    logger = logging.getLogger("voicert.ws")
    if not any(isinstance(f, _HandshakeFilter) for f in logger.filters):
        logger.addFilter(_HandshakeFilter())
    return logger
