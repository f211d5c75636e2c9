"""The process's log lines: one format, and the libraries that talk too much held to warnings.

faster-whisper logs every decode at INFO; torch logs its FakeTensor cache statistics at INFO from
an ``atexit`` hook, so a Ctrl-C during start-up used to end with torch internals."""

from __future__ import annotations

import logging

QUIET = ("faster_whisper", "torch")  # loggers held to WARNING whatever the configured level


def setup_logging(level: str, fmt: str = "%(asctime)s %(levelname)s %(name)s: %(message)s") -> None:
    """Configure the root logger at ``level`` (``log.level``) with ``fmt``."""
    logging.basicConfig(level=level.upper(), format=fmt)
    for name in QUIET:
        logging.getLogger(name).setLevel(logging.WARNING)
