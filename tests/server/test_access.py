"""Access control: bearer tokens (header or query), origin allow-list, message-rate limit."""

from __future__ import annotations

import asyncio
import dataclasses
import http

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from tests.conftest import wav
from voicert.client import stream_audio
from voicert.core.bucket import TokenBucket
from voicert.protocol import native as p
from voicert.server import access
from voicert.server.app import STREAM_PATH, VoiceServer


def test_token_from_header_or_query():
    assert access.presented_token("/v1/stream", "Bearer abc") == "abc"
    assert access.presented_token("/v1/stream?token=xyz&a=1", None) == "xyz"
    assert access.presented_token("/v1/stream?token=q", "bearer h") == "h"  # header first
    assert access.presented_token("/v1/stream", "Basic abc") is None


def test_check_order_and_defaults():
    assert access.check("/x", None, None, (), ()) is None  # nothing configured: open
    r = access.check("/x", None, None, ("t",), ())
    assert r.status is http.HTTPStatus.UNAUTHORIZED and r.headers[0][0] == "WWW-Authenticate"
    assert access.check("/x?token=t", None, None, ("t",), ()) is None
    assert (
        access.check("/x", "Bearer t", "https://evil", ("t",), ("https://ok",)).status
        is http.HTTPStatus.FORBIDDEN
    )
    assert access.check("/x", "Bearer t", None, ("t",), ("https://ok",)) is None  # not a browser


def test_rate_limiter_allows_bursts_then_the_average():
    lim = TokenBucket(rate=10, burst=3)
    assert [lim.allow(0.0) for _ in range(4)] == [True, True, True, False]
    assert lim.allow(0.1)  # one token back after 100 ms
    assert not lim.allow(0.1)
    assert TokenBucket(0, 1).allow(0.0)  # 0: no limit


@pytest.fixture(scope="module")
async def guarded(services):
    cfg = services.cfg
    cfg = dataclasses.replace(
        cfg,
        server=dataclasses.replace(
            cfg.server,
            port=0,
            auth_tokens="s3cret, other",
            allowed_origins="https://ok.example",
            max_messages_per_s=60,
            message_burst=30,
            max_bytes_per_s=200_000,
            byte_burst=1 << 20,
        ),
    )  # real-time 20 ms frames are 50/s; 16 kHz pcm16 is 32 kB/s
    srv = VoiceServer(dataclasses.replace(services, cfg=cfg))
    await srv.start()
    yield srv
    await srv.shutdown()


async def refused(url, **kw) -> int:
    with pytest.raises(InvalidStatus) as info:
        async with connect(url, **kw):
            pass
    return info.value.response.status_code


async def test_missing_or_wrong_token_is_401_on_every_websocket_route(guarded):
    base = f"ws://127.0.0.1:{guarded.port}"
    assert await refused(base + STREAM_PATH) == 401
    assert (
        await refused(base + STREAM_PATH, additional_headers={"Authorization": "Bearer nope"})
        == 401
    )
    assert await refused(base + "/v1/dashboard") == 401
    assert await refused(base + "/v1/dashboard?token=nope") == 401
    assert await refused(base + "/v1/realtime?model=x") == 401
    assert await refused(base + "/twilio?token=nope") == 401


async def test_realtime_and_twilio_accept_the_token(guarded):
    import json

    from voicert.protocol import twilio as tw

    base = f"ws://127.0.0.1:{guarded.port}"
    async with connect(
        base + "/v1/realtime?model=x", additional_headers={"Authorization": "Bearer s3cret"}
    ) as ws:
        assert json.loads(await ws.recv())["type"] == "session.created"  # how the SDK sends it
    async with connect(base + "/twilio?token=s3cret") as ws:  # how a TwiML <Stream> URL carries it
        await ws.send(tw.InboundWriter("MZ1", "CA1").start())
        await ws.send(tw.InboundWriter("MZ1", "CA1").stop())
        await ws.wait_closed()
        assert ws.close_code == 1000


async def test_a_repeated_authorization_origin_or_host_header_is_400_not_500(guarded):
    from websockets.datastructures import Headers

    url = f"ws://127.0.0.1:{guarded.port}{STREAM_PATH}"
    for name, values in (
        ("Authorization", ["Bearer s3cret", "Bearer nope"]),
        ("Origin", ["https://ok.example", "https://evil.example"]),
        ("Host", ["evil.example"]),  # the client's own Host header is the first
    ):
        headers = Headers([(name, v) for v in values])
        assert await refused(url + "?token=s3cret", additional_headers=headers) == 400, name
    async with connect(url, additional_headers={"Authorization": "Bearer s3cret"}) as ws:
        await ws.send(p.encode(p.SessionStart()))  # the server goes on serving
        assert p.decode_server(await ws.recv())["type"] == "session.started"


def test_single_valued_headers_are_read_once_case_blind():
    ok = access.single_values([("authorization", "Bearer a"), ("X-Other", "1"), ("X-Other", "2")])
    assert ok == {"Authorization": "Bearer a"}
    twice = access.single_values([("Origin", "a"), ("origin", "b")])
    assert isinstance(twice, access.Refusal) and twice.status == 400 and "Origin" in twice.reason


async def test_foreign_browser_origin_is_403(guarded):
    url = f"ws://127.0.0.1:{guarded.port}{STREAM_PATH}?token=s3cret"
    assert await refused(url, origin="https://evil.example") == 403
    async with connect(url, origin="https://ok.example") as ws:
        await ws.send(p.encode(p.SessionStart()))
        assert p.decode_server(await ws.recv())["type"] == "session.started"


async def test_valid_token_in_header_or_query_completes_a_turn(guarded):
    url = f"ws://127.0.0.1:{guarded.port}{STREAM_PATH}"
    async with connect(url, additional_headers={"Authorization": "Bearer other"}) as ws:
        await ws.send(p.encode(p.SessionStart()))
        assert p.decode_server(await ws.recv())["type"] == "session.started"
    result = await stream_audio(url + "?token=s3cret", [wav("capital_of_france")])
    assert "paris" in result.turns[0].reply.lower()  # real-time audio stays under the rate limit


async def test_flooding_messages_closes_with_1008(guarded):
    url = f"ws://127.0.0.1:{guarded.port}{STREAM_PATH}?token=s3cret"
    async with connect(url) as ws:
        await ws.send(p.encode(p.SessionStart()))
        await ws.recv()
        with pytest.raises(ConnectionClosed):
            for _ in range(200):
                await ws.send(p.encode(p.Audio(b"\x00\x00" * 160)))
            for _ in range(50):
                ev = p.decode_server(await asyncio.wait_for(ws.recv(), 60))
                if ev["type"] == "error":
                    assert ev["code"] == "rate_limited" and ev["fatal"]
        assert ws.close_code == 1008


async def test_a_flood_of_large_frames_closes_with_1008_after_the_byte_burst(guarded):
    """A few frames far under the message rate, but of 16 s of audio each: the connection is
    cut once it has sent its byte burst (1 MiB here), not after its message burst."""
    url = f"ws://127.0.0.1:{guarded.port}{STREAM_PATH}?token=s3cret"
    frame = p.encode(p.Audio(bytes(2**19)))  # 512 KiB
    errors = []
    async with connect(url, max_size=None) as ws:
        await ws.send(p.encode(p.SessionStart()))
        await ws.recv()
        with pytest.raises(ConnectionClosed):
            for _ in range(10):
                await ws.send(frame)
            while True:
                ev = p.decode_server(await asyncio.wait_for(ws.recv(), 60))
                if ev["type"] == "error":
                    errors.append(ev)
        assert ws.close_code == 1008
    fatal = [e for e in errors if e["fatal"]]
    assert len(fatal) == 1 and fatal[0]["code"] == "rate_limited"
    assert "bytes/s" in fatal[0]["message"]


@pytest.mark.parametrize(
    "host, allowed, ok",
    [
        ("127.0.0.1:8765", (), True),
        ("[::1]:8765", (), True),
        ("10.0.0.7", (), True),
        ("localhost:8765", (), True),
        ("app.localhost", (), True),
        ("LOCALHOST", (), True),
        ("rebind.attacker.example:8765", (), False),  # a page's own name, resolved to us
        ("voice.example.com", ("voice.example.com",), True),
        ("voice.example.com:443", ("VOICE.example.com",), True),
        ("a.voice.example.com", (".voice.example.com",), True),
        ("voice.example.com", (".voice.example.com",), True),
        ("evilvoice.example.com", (".voice.example.com",), False),
        ("anything.example", ("*",), True),
        (None, (), True),  # HTTP/1.0 without Host: not a browser
    ],
)
def test_the_host_a_request_names_must_be_this_servers(host, allowed, ok):
    assert access.host_allowed(host, allowed) is ok
