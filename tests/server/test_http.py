"""The HTTP side of the listening socket: routes by method and path, bodies, limits, and the
WebSocket upgrade hand-off on the same port."""

import asyncio

import pytest
from websockets.asyncio.client import connect

from voicert.server import http as vhttp


async def raw(port: int, data: bytes, read_timeout: float = 30) -> bytes:
    """Send raw bytes; return everything the server sends back before it closes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    await writer.drain()
    try:
        return await asyncio.wait_for(reader.read(), read_timeout)
    finally:
        writer.close()


def status_of(response: bytes) -> int:
    return int(response.split(b" ", 2)[1])


async def test_a_websocket_path_without_an_upgrade_says_upgrade_required(server):
    got = await raw(server.port, b"GET /v1/stream HTTP/1.1\r\nHost: localhost\r\n\r\n")
    assert status_of(got) == 426 and b"upgrade: websocket" in got.lower()


async def test_a_wrong_method_is_refused_with_the_allowed_ones(server):
    got = await raw(
        server.port, b"POST /healthz HTTP/1.1\r\nHost: localhost\r\nContent-Length: 0\r\n\r\n"
    )
    assert status_of(got) == 405 and b"allow: get" in got.lower()


async def test_a_body_over_the_limit_is_refused_before_it_is_read(server):
    limit = server.cfg.server.max_message_bytes
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Length: {limit + 1}\r\n\r\n"
    ).encode()
    assert status_of(await raw(server.port, head)) == 413


async def test_a_chunked_body_over_the_limit_is_refused(server):
    limit = server.cfg.server.max_message_bytes
    piece = b"x" * 4096
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(piece), piece) for _ in range(limit // 4096 + 2))
    got = await raw(
        server.port,
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n" + chunks + b"0\r\n\r\n",
    )
    assert status_of(got) == 413


@pytest.mark.parametrize(
    "junk",
    [
        b"NOT HTTP AT ALL\r\n\r\n",
        b"GET / HTTP/1.1\r\nBad Header\r\n\r\n",
        b"GET /" + b"a" * 20000 + b" HTTP/1.1\r\n\r\n",
    ],
)
async def test_a_malformed_request_gets_a_4xx_and_the_server_goes_on(server, junk):
    assert 400 <= status_of(await raw(server.port, junk)) < 500
    assert (
        status_of(await raw(server.port, b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n"))
        == 200
    )


@pytest.mark.parametrize(
    "extra",
    [
        "".join(f"X-H{i}: v\r\n" for i in range(500)),  # too many fields
        "".join(f"X-H{i}: v\r\n" for i in range(1500)),
        "X-Big: " + "v" * 100_000 + "\r\n",  # one huge value
    ],
    ids=["500-headers", "1500-headers", "100kb-value"],
)
@pytest.mark.parametrize("path", ["/healthz", "/v1/stream"])
async def test_oversized_heads_get_431_however_they_arrive(server, extra, path):
    """A head that arrives in one piece was parsed whatever its size (h11 bounds only heads that
    arrive in pieces) and answered 200, where Envoy and NGINX answer 431."""
    upgrade = (
        "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
        if path == "/v1/stream"
        else ""
    )
    head = f"GET {path} HTTP/1.1\r\nHost: localhost\r\n{upgrade}{extra}\r\n".encode()
    assert status_of(await raw(server.port, head)) == 431
    assert (
        status_of(await raw(server.port, b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n"))
        == 200
    )


async def test_a_request_that_never_completes_is_closed_after_the_head_timeout(server, monkeypatch):
    monkeypatch.setattr(vhttp, "HEAD_TIMEOUT_S", 0.2)
    got = await raw(server.port, b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n")  # no blank line
    assert status_of(got) == 408


async def test_a_query_string_does_not_change_the_route(server):
    got = await raw(server.port, b"GET /healthz?probe=1 HTTP/1.1\r\nHost: localhost\r\n\r\n")
    assert status_of(got) == 200 and got.endswith(b"ok\n")


async def test_a_websocket_upgrade_on_the_same_port_is_served_by_websockets(server):
    async with connect(f"ws://127.0.0.1:{server.port}/v1/stream") as ws:
        await ws.ping()


def test_routes_find_handlers_and_refusals():
    async def h(request):
        return vhttp.text(200, "x")

    routes = vhttp.Routes()
    routes.add("GET", "/a", h)
    routes.add_websocket("/ws")
    assert routes.find("GET", "/a") is h
    assert routes.find("PUT", "/a").status == 405
    assert routes.find("GET", "/ws").status == 426
    assert routes.find("GET", "/nope").status == 404
    assert vhttp.route_path("/a/b?x=1&y") == ("/a/b", "x=1&y")


async def test_a_client_that_half_closes_after_its_request_still_gets_the_answer(server):
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
    await writer.drain()
    writer.write_eof()
    got = await asyncio.wait_for(reader.read(), 30)
    writer.close()
    assert status_of(got) == 200 and got.endswith(b"ok\n")


def _options(path: str, origin: str, method: str = "POST") -> bytes:
    return (
        f"OPTIONS {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nOrigin: {origin}\r\n"
        f"Access-Control-Request-Method: {method}\r\n"
        "Access-Control-Request-Headers: authorization, content-type\r\n\r\n"
    ).encode()


def _header(response: bytes, name: str) -> str | None:
    for line in response.split(b"\r\n\r\n", 1)[0].split(b"\r\n")[1:]:
        key, _, value = line.decode("latin-1").partition(":")
        if key.strip().lower() == name.lower():
            return value.strip()
    return None


async def test_a_cors_preflight_from_the_servers_own_page_is_answered(server):
    """A page on an admitted origin (here the server's own) could not use the HTTP API: its
    preflight got 405 and no Access-Control-Allow-Origin."""
    own = f"http://127.0.0.1:{server.port}"
    got = await raw(server.port, _options("/v1/chat/completions", own).replace(
        b"Host: 127.0.0.1", f"Host: 127.0.0.1:{server.port}".encode()))  # fmt: skip
    assert status_of(got) == 204
    assert _header(got, "Access-Control-Allow-Origin") == own
    assert "POST" in (_header(got, "Access-Control-Allow-Methods") or "")
    assert "authorization" in (_header(got, "Access-Control-Allow-Headers") or "").lower()
    evil = await raw(server.port, _options("/v1/chat/completions", "https://evil.example"))
    assert status_of(evil) == 403 and _header(evil, "Access-Control-Allow-Origin") is None
    health = (
        f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\nOrigin: {own}\r\n\r\n"
    ).encode()
    got = await raw(server.port, health)  # the answer itself is readable by that page
    assert status_of(got) == 200 and _header(got, "Access-Control-Allow-Origin") == own


@pytest.mark.parametrize("path", ["/healthz", "/v1/chat/completions", "/v1/stream"])
async def test_a_request_naming_another_host_is_refused_before_it_is_routed(server, path):
    # DNS rebinding: a page at rebind.example whose name was made to resolve to 127.0.0.1 sends
    # its own name in Host (and as its Origin, which a Host-based same-origin check would pass)
    upgrade = (
        "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
        if path == "/v1/stream"
        else ""
    )
    head = (
        f"GET {path} HTTP/1.1\r\nHost: rebind.example:{server.port}\r\n"
        f"Origin: http://rebind.example:{server.port}\r\n{upgrade}\r\n"
    )
    got = await raw(server.port, head.encode())
    assert status_of(got) == 403 and b"server.allowed_hosts" in got
    two = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nHost: rebind.example\r\n\r\n"
    assert status_of(await raw(server.port, two)) == 400
    ok = f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n\r\n".encode()
    assert status_of(await raw(server.port, ok)) == 200


async def test_a_listed_host_name_is_served(services):
    from tests.conftest import server_with

    srv = await server_with(services, allowed_hosts=".voice.example")
    try:
        for host, status in (("eu.voice.example", 200), ("rebind.example", 403)):
            head = f"GET /healthz HTTP/1.1\r\nHost: {host}:{srv.port}\r\n\r\n".encode()
            assert status_of(await raw(srv.port, head)) == status, host
    finally:
        await srv.shutdown()


async def _open_doors(srv, n: int) -> None:
    """Until the server holds exactly ``n`` plain connections (accepted, not yet answered)."""
    async with asyncio.timeout(60):
        while len(srv._listener.doors) != n:
            await asyncio.sleep(0.01)


async def test_connections_over_the_limit_get_503_but_probes_are_answered(services):
    from tests.conftest import server_with

    srv = await server_with(services, max_sessions=1, max_connections=2)
    try:
        idle = [await asyncio.open_connection("127.0.0.1", srv.port) for _ in range(2)]
        await _open_doors(srv, 2)  # both accepted: the limit is reached
        over = await raw(srv.port, b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert status_of(over) == 503 and b"Retry-After: 1" in over
        probe = await raw(srv.port, b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert status_of(probe) == 200
        for _, writer in idle:
            writer.close()
        await _open_doors(srv, 0)
        again = await raw(srv.port, b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert status_of(again) == 200
    finally:
        await srv.shutdown()


async def test_a_flood_past_the_probes_room_is_answered_unread_and_closed(services):
    from tests.conftest import server_with
    from voicert.server.http import PROBE_ROOM

    srv = await server_with(services, max_sessions=1, max_connections=1)
    try:
        held = [await asyncio.open_connection("127.0.0.1", srv.port) for _ in range(PROBE_ROOM + 1)]
        await _open_doors(srv, PROBE_ROOM + 1)
        flood = await raw(srv.port, b"")  # sends nothing: answered anyway, and closed
        assert status_of(flood) == 503
        for _, writer in held:
            writer.close()
    finally:
        await srv.shutdown()


async def test_a_head_whose_lines_end_in_a_bare_lf_is_read_not_called_too_large(server):
    """h11 reads LF-only lines; the head's size check looked for CRLF CRLF only and answered a
    small request 431 "request head over 16384 bytes"."""
    assert status_of(await raw(server.port, b"GET /healthz HTTP/1.1\nHost: localhost\n\n")) == 200
    mixed = b"GET /healthz HTTP/1.1\r\nHost: localhost\n\r\n"
    assert status_of(await raw(server.port, mixed)) == 200
