"""Token streams: the engine thread produces TokenEvents, an asyncio task consumes them."""

from __future__ import annotations

import asyncio

from voicert.engine.base import TokenEvent


class TokenStream:
    """Async iterator over one request's TokenEvents, fed from the engine thread."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._queue: asyncio.Queue[TokenEvent] = asyncio.Queue()
        self._ended = False

    def put_threadsafe(self, event: TokenEvent) -> None:
        """Called on the engine thread; wakes the consumer with one loop callback."""
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, event)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            pass

    @staticmethod
    def post_all(items: list[tuple["TokenStream", TokenEvent]]) -> None:
        """Called on the engine thread with one step's events: one loop wake-up per event loop,
        however many streams and tokens the step produced."""
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[TokenStream, TokenEvent]]] = {}
        by_key: dict[object, list] = {}
        for stream, event in items:
            loop = getattr(stream, "_loop", None)
            key = getattr(stream, "batch_key", None)
            if loop is not None:
                by_loop.setdefault(loop, []).append((stream, event))
            elif key is not None:  # a sink that takes a step's events at once (engine process)
                by_key.setdefault(key, []).append((stream, event))
            else:  # e.g. a warm-up sink: deliver directly
                stream.put_threadsafe(event)
        for key, batch in by_key.items():
            key.deliver(batch)
        for loop, batch in by_loop.items():
            try:
                loop.call_soon_threadsafe(_deliver, batch)
            except RuntimeError:  # the loop is closed: nobody is listening any more
                pass

    def __aiter__(self) -> "TokenStream":
        return self

    async def __anext__(self) -> TokenEvent:
        if self._ended:
            raise StopAsyncIteration
        event = await self._queue.get()
        if event.finish_reason is not None:
            self._ended = True
        return event


def _deliver(batch: list[tuple[TokenStream, TokenEvent]]) -> None:
    for stream, event in batch:
        stream._queue.put_nowait(event)
