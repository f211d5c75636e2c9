"""Token streams: an engine thread (or the engine process's reader thread) produces a request's
records, an asyncio task consumes them as :class:`~voicert.core.llm.TokenEvent`s."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Protocol

from voicert.core.llm import TokenEvent
from voicert.engine.base import TokenOut
from voicert.engine.clients.detok import IncrementalDetokenizer


class Sink(Protocol):
    """Where a request's records go: a :class:`TokenStream`, or a blocking caller's sink."""

    def put_threadsafe(self, event: TokenEvent | TokenOut) -> None: ...


class TokenStream:
    """Async iterator over one request's TokenEvents, fed from another thread.

    Fed :class:`TokenOut` records (token ids, from the engine core), it detokenises them here, on the
    consumer's event loop, with its own :class:`IncrementalDetokenizer` (so the engine thread or
    process only steps); fed TokenEvents (the simple engine), it passes them through."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, detok: IncrementalDetokenizer | None = None
    ) -> None:
        self._loop = loop
        self._detok = detok
        self._queue: asyncio.Queue[TokenEvent | TokenOut] = asyncio.Queue()
        self._ended = False

    def put_threadsafe(self, event: TokenEvent | TokenOut) -> None:
        """Called on a producer thread; wakes the consumer with one loop callback."""
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, event)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            pass

    def put(self, event: TokenEvent | TokenOut) -> None:
        """Called on the consumer's own event loop (a producer task there)."""
        self._queue.put_nowait(event)

    @staticmethod
    def post_all(items: Sequence[tuple[Sink, TokenEvent | TokenOut]]) -> None:
        """Called on a producer thread with one step's records: one loop wake-up per event loop,
        however many streams and tokens the step produced. Sinks without a loop (a warm-up's)
        get theirs directly."""
        by_loop: dict[asyncio.AbstractEventLoop, list] = {}
        for sink, event in items:
            if isinstance(sink, TokenStream):
                by_loop.setdefault(sink._loop, []).append((sink, event))
            else:
                sink.put_threadsafe(event)
        for loop, batch in by_loop.items():
            try:
                loop.call_soon_threadsafe(_deliver, batch)
            except RuntimeError:  # the loop is closed: nobody is listening any more
                pass

    def __aiter__(self) -> TokenStream:
        return self

    async def __anext__(self) -> TokenEvent:
        if self._ended:
            raise StopAsyncIteration
        item = await self._queue.get()
        if item.finish_reason is not None:
            self._ended = True
        return self._event(item) if isinstance(item, TokenOut) else item

    def _event(self, out: TokenOut) -> TokenEvent:
        text = ""
        if out.token_id >= 0 and self._detok is not None:
            text = self._detok.push(out.token_id)
        return TokenEvent(
            out.index,
            out.token_id,
            text,
            out.sampled_ns,
            out.prefill_start_ns,
            out.prompt_tokens,
            out.finish_reason,
            out.error,
            out.end_prob,
            out.turn_prob,
        )


def _deliver(batch: list[tuple[TokenStream, TokenEvent | TokenOut]]) -> None:
    for stream, event in batch:
        stream._queue.put_nowait(event)
