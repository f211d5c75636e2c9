"""What the engine's own parts share beyond the contract in ``core/llm.py``: the core's token
records (no text: clients detokenise) and the ledger of open requests an engine client keeps."""

from __future__ import annotations

import threading
import time

import msgspec

from voicert.core.llm import EngineStats


class TokenOut(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """What the engine core produces: one generated token id, or a request's final record
    (``finish_reason`` set, ``token_id`` -1). No text: the client detokenises
    (:class:`~voicert.engine.clients.stream.TokenStream`), so the core's thread (or process) only steps."""

    request_id: str
    index: int  # 0-based position in the reply; the final record repeats the token count
    token_id: int
    sampled_ns: int
    prefill_start_ns: int
    prompt_tokens: int
    finish_reason: str | None = None
    error: str | None = None
    end_prob: float | None = None  # a score_end request's final record: its probability
    turn_prob: float | None = None  # ... and the model's end-of-turn head's (where it has one)


def final_out(request_id: str, reason: str, error: str | None = None) -> TokenOut:
    """The final record of a request that ends before (or without) reaching the engine core."""
    return TokenOut(request_id, 0, -1, time.perf_counter_ns(), 0, 0, reason, error)


class RequestLedger:
    """Which requests an engine holds, and its counters; thread-safe (the event loop opens and
    queries, the engine thread closes)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._live: set[str] = set()
        self._stats = EngineStats()

    def opened(self, request_id: str, count: bool = True) -> None:
        with self._lock:
            self._live.add(request_id)
            self._stats.submitted += count

    def closed(self, request_id: str, reason: str, tokens: int) -> None:
        with self._lock:
            self._live.discard(request_id)
            self._stats.finished += 1
            self._stats.tokens += tokens
            self._stats.cancelled += reason == "cancelled"

    def holds(self, request_id: str) -> bool:
        with self._lock:
            return request_id in self._live

    def live(self) -> set[str]:
        with self._lock:
            return set(self._live)

    def snapshot(self) -> EngineStats:
        with self._lock:
            s = self._stats
            return EngineStats(len(self._live), s.submitted, s.finished, s.cancelled, s.tokens)
