"""Large client messages are decoded off the event loop.

A door's codec is plain code (sans-I/O), and most messages are small: they are decoded where they
arrive. One that is large may carry a tool list whose schemas llguidance checks (hundreds of ms
for a 700 KB list; "Hostile input, round two", item 5), and that must not stall every other
session on the loop. Decoding it on a worker thread lets the loop go on: llguidance releases the
GIL while it checks (measured: 16 ms of loop lag at most during a 0.36 s check).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")
OFF_LOOP_BYTES = 64 * 1024  # messages at least this large are decoded on a worker thread


async def decode(fn: Callable[..., T], data: bytes | str, *args) -> T:
    """``fn(data, *args)``: here for a small message, on a worker thread for a large one. The
    caller awaits it before the next message, so messages keep their order."""
    if len(data) < OFF_LOOP_BYTES:
        return fn(data, *args)
    return await asyncio.to_thread(fn, data, *args)
