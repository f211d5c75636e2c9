"""The dashboard feed's socket (server/dashboard.py): a dashboard that leaves is let go at once, not
at the feed's next message, and a message sent to the feed closes it with 1003. The feed's
contents are tests/web/test_dashboard.py's."""

from __future__ import annotations

import asyncio
import json

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from tests.conftest import server_with
from voicert.server.connection import CLOSE_UNSUPPORTED_DATA
from voicert.server.dashboard import FEED_PATH


async def _until(check, guard_s: float = 60.0) -> None:
    """Wait for ``check()`` (the guard only stops a hang: nothing here is timed)."""
    async with asyncio.timeout(guard_s):
        while not check():
            await asyncio.sleep(0.01)


async def test_a_dashboard_that_leaves_between_messages_is_let_go_at_once(services):
    """With nothing to send (no sampler ticks, no turns), the feed still sees its dashboard
    leave: its handler ends, and a shutdown does not wait on it (it once waited for the next
    tick, which a sampler ahead of its clock put minutes away)."""
    srv = await server_with(services)
    try:
        assert srv.sampler is not None
        await srv.sampler.stop()  # no system samples from here on
        async with connect(f"ws://127.0.0.1:{srv.port}{FEED_PATH}") as ws:
            assert json.loads(await ws.recv())["type"] == "snapshot"
            await _until(lambda: len(srv.dashboard_conns) == 1)
        await _until(lambda: not srv.dashboard_conns)
    finally:
        await asyncio.wait_for(srv.shutdown(), 60)


async def test_a_message_sent_to_the_dashboard_feed_closes_it_with_1003(server):
    url = f"ws://127.0.0.1:{server.port}{FEED_PATH}"
    async with connect(url) as ws:
        assert json.loads(await ws.recv())["type"] == "snapshot"
        await ws.send(json.dumps({"type": "subscribe"}))
        with pytest.raises(ConnectionClosed):
            async with asyncio.timeout(60):  # (a guard against a hang only)
                while True:  # (a sample or a turn may come before the close)
                    await ws.recv()
    assert ws.close_code == CLOSE_UNSUPPORTED_DATA
    assert ws.close_reason == "the dashboard feed takes no messages"
    async with connect(url) as other:  # the feed still serves
        assert json.loads(await other.recv())["type"] == "snapshot"
