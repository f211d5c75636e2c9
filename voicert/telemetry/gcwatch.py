"""Garbage-collector pauses: timed, and kept short.

A full (generation 2) collection walks every object the collector tracks while holding the GIL. A
process that has imported transformers and holds a model, a tokenizer and a table of ~100k KV
blocks tracks hundreds of thousands of objects: one full collection stops every Python thread of
the process for tens of milliseconds, in whatever engine step or audio frame happens to allocate
at that moment. :func:`settle`, called once everything is loaded, moves all surviving objects into
the permanent generation (``gc.freeze``), so later collections walk only what serving allocates.
:class:`GcWatch` times every collection, for ``/metrics``.
"""

from __future__ import annotations

import collections
import gc
import time

from voicert.core.llm import GcPause


class GcWatch:
    """Records every collection of this process (the most recent ``maxlen``) until removed."""

    def __init__(self, maxlen: int = 4096) -> None:
        self._pauses: collections.deque[GcPause] = collections.deque(maxlen=maxlen)
        self._start_ns = 0

    def install(self) -> GcWatch:
        gc.callbacks.append(self._on_gc)
        return self

    def remove(self) -> None:
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)

    def _on_gc(self, phase: str, info: dict) -> None:
        # called by the thread that triggered the collection, with the GIL held
        if phase == "start":
            self._start_ns = time.perf_counter_ns()
        else:
            self._pauses.append(
                GcPause(info["generation"], (time.perf_counter_ns() - self._start_ns) / 1e9)
            )

    def drain(self) -> list[GcPause]:
        """The pauses since the last call."""
        out = []
        while self._pauses:
            out.append(self._pauses.popleft())
        return out


def settle() -> int:
    """Collect once, then exempt every surviving object from later collections. Call when the
    process has loaded what it keeps for its lifetime. Returns how many objects were frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
