"""The process's log lines: one format, safe to read and to keep, and the libraries that talk
too much held to warnings.

Every line goes through :class:`SafeFormatter`: secrets are masked wherever they appear in a
message (a ``?token=`` or ``?auth=`` query, an ``Authorization`` or ``X-Twilio-Signature`` header
that websockets' debug log prints, a ``Bearer`` value, an API key), and control characters are
escaped, so a caller's field with a newline in it (a carrier's ``callSid``, a message) cannot
write a line of its own with a forged time and level. Tracebacks keep their lines.

faster-whisper logs every decode at INFO; torch logs its FakeTensor cache statistics at INFO from
an ``atexit`` hook, so a Ctrl-C during start-up used to end with torch internals."""

from __future__ import annotations

import logging
import re

QUIET = ("faster_whisper", "torch")  # loggers held to WARNING whatever the configured level
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
MASK = "***"
_SECRETS = (
    # a query's secret parameters: ?token=..., &auth=..., api_key=...
    re.compile(
        r"(?i)([?&;](?:token|auth|access_token|api[_-]?key|key|password|secret|signature|sig)=)"
        r"[^&\s#\"']*"
    ),
    # a header that carries a credential, as a debug log prints it ("> Authorization: Bearer x")
    re.compile(
        r"(?i)(\b(?:authorization|proxy-authorization|x-api-key|api-key|cookie|set-cookie"
        r"|x-twilio-signature|telnyx-signature-ed25519|x-plivo-signature-v3)\s*:\s*).*"
    ),
    re.compile(r"(?i)(\bbearer\s+)[^\s,;\"']+"),  # a bearer value anywhere else
)
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def clean(message: str) -> str:
    """``message`` with its secrets masked and its control characters escaped (one line)."""
    for pattern in _SECRETS:
        message = pattern.sub(lambda m: m.group(1) + MASK, message)
    return _CONTROL.sub(_escape, message)


def _escape(m: re.Match) -> str:
    c = m.group(0)
    return {"\n": "\\n", "\r": "\\r", "\t": "\\t"}.get(c) or f"\\x{ord(c):02x}"


class SafeFormatter(logging.Formatter):
    """A formatter whose messages are :func:`clean` (the traceback after them is left whole)."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = clean(record.message)
        return super().formatMessage(record)


def setup_logging(level: str, fmt: str = FORMAT) -> None:
    """Configure the root logger at ``level`` (``log.level``) with ``fmt``, every line safe."""
    root = logging.getLogger()
    had = list(root.handlers)
    logging.basicConfig(level=level.upper(), format=fmt)
    for handler in root.handlers:
        if handler not in had:  # its own; a host's (pytest's) handlers keep their format
            handler.setFormatter(SafeFormatter(fmt))
    for name in QUIET:
        logging.getLogger(name).setLevel(logging.WARNING)
