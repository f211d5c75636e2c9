"""One listening socket, two protocols, one route table.

Each accepted connection starts as an :class:`HttpDoor`, which parses the request head with h11.
A WebSocket upgrade is handed, with the bytes read so far, to a websockets ``ServerConnection``
made exactly as ``websockets.asyncio.server.serve`` makes one (its documented ``Server.wrap``
pattern), so the WebSocket side, its ``process_request`` checks and its limits are websockets' own.
Any other request is plain HTTP/1.1: any method, a body up to a limit, answered by the route's
handler with a whole body or a stream (chunked: server-sent events), one request per connection.

Contract for handlers: ``async def handler(request: HttpRequest) -> HttpResponse``. A streamed
response's iterator is closed (its ``finally`` runs) if the client goes away mid-stream.
"""

from __future__ import annotations

import asyncio
import http
import json
import logging
import re
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import h11
from websockets.asyncio.server import Server, ServerConnection
from websockets.server import ServerProtocol

from voicert.server.access import host_allowed

log = logging.getLogger(__name__)
MAX_HEAD_BYTES = 16 * 1024  # request line and headers
_HEAD_END = re.compile(rb"\r?\n\r?\n")  # the empty line that ends a request head
MAX_HEADERS = 100  # header fields in one request (Envoy's default)
MAX_HEADER_BYTES = 8 * 1024  # one header line (NGINX's large_client_header_buffers: 8k)
HEAD_TIMEOUT_S = 10.0  # a plain request (head and body) must arrive within this
SERVER_NAME = "voicert"
PROBE_PATHS = ("/healthz", "/readyz")  # answered over the connection limit (a probe is cheap)
PROBE_ROOM = 32  # connections over the limit still read for a probe; beyond, closed at once


@dataclass(frozen=True, slots=True)
class HttpRequest:
    method: str
    path: str  # without the query
    query: str
    headers: dict[str, str]  # names lower-cased; repeated headers joined with ", "
    body: bytes = b""

    def header(self, name: str) -> str | None:
        return self.headers.get(name.lower())


@dataclass(slots=True)
class HttpResponse:
    status: int
    body: bytes = b""
    content_type: str = "text/plain; charset=utf-8"
    headers: list[tuple[str, str]] = field(default_factory=list)
    stream: AsyncIterator[bytes] | None = None  # sent chunked after the head, instead of body


def text(status: int, body: str, headers: list[tuple[str, str]] | None = None) -> HttpResponse:
    return HttpResponse(status, body.encode(), headers=list(headers or []))


def json_response(status: int, payload: object) -> HttpResponse:
    return HttpResponse(
        status, json.dumps(payload, separators=(",", ":")).encode(), "application/json"
    )


Handler = Callable[[HttpRequest], Awaitable[HttpResponse]]


def route_path(target: str) -> tuple[str, str]:
    """(path, query) of a request target; the one place a path is split off its query."""
    parts = urlsplit(target)
    return parts.path or "/", parts.query


class Routes:
    """Plain HTTP routes by (method, path) and the paths that take a WebSocket upgrade."""

    def __init__(self, cors: Callable[[str, str | None], bool] | None = None) -> None:
        self._http: dict[str, dict[str, Handler]] = {}
        self.websocket: set[str] = set()
        self.cors = cors  # (Origin, Host) -> may that browser origin use the HTTP routes?

    def add(self, method: str, path: str, handler: Handler) -> None:
        self._http.setdefault(path, {})[method.upper()] = handler

    def add_websocket(self, path: str) -> None:
        self.websocket.add(path)

    def preflight(self, request: HttpRequest) -> HttpResponse:
        """The answer to a CORS preflight (``OPTIONS`` with ``Origin`` and
        ``Access-Control-Request-Method``): 204 with the route's methods for an admitted origin,
        403 for another, 404 / 405 for a route or method there is not."""
        methods = self._http.get(request.path)
        if methods is None:
            return text(http.HTTPStatus.NOT_FOUND, f"no route {request.path}\n")
        origin = request.header("Origin") or ""
        if self.cors is None or not self.cors(origin, request.header("Host")):
            return text(http.HTTPStatus.FORBIDDEN, f"origin {origin[:100]!r} not allowed\n")
        asked = (request.header("Access-Control-Request-Method") or "").upper()
        allow = ", ".join(sorted(methods))
        if asked not in methods:
            return text(http.HTTPStatus.METHOD_NOT_ALLOWED, f"{asked[:16]} not allowed\n",
                        [("Allow", allow)])  # fmt: skip
        return HttpResponse(
            http.HTTPStatus.NO_CONTENT,
            headers=[
                ("Access-Control-Allow-Origin", origin),
                ("Access-Control-Allow-Methods", allow),
                ("Access-Control-Allow-Headers", "Authorization, Content-Type"),
                ("Access-Control-Max-Age", "600"),
                ("Vary", "Origin"),
            ],
        )

    def with_cors(self, request: HttpRequest, response: HttpResponse) -> HttpResponse:
        """``response`` readable by the page that asked, when its origin is admitted."""
        origin = request.header("Origin")
        if origin and self.cors is not None and self.cors(origin, request.header("Host")):
            response.headers += [("Access-Control-Allow-Origin", origin), ("Vary", "Origin")]
        return response

    def find(self, method: str, path: str) -> Handler | HttpResponse:
        """The handler for a plain request, or the response that refuses it."""
        methods = self._http.get(path)
        if methods is None:
            if path in self.websocket:
                return text(
                    http.HTTPStatus.UPGRADE_REQUIRED,
                    f"{path} is a WebSocket route\n",
                    [("Upgrade", "websocket")],
                )
            return text(http.HTTPStatus.NOT_FOUND, f"no route {path}\n")
        handler = methods.get(method)
        if handler is None:
            return text(
                http.HTTPStatus.METHOD_NOT_ALLOWED,
                f"{method} not allowed on {path}\n",
                [("Allow", ", ".join(sorted(methods)))],
            )
        return handler


def head_too_large(event: h11.Request, raw: bytes | bytearray) -> str | None:
    """Why a request's head is refused with 431, or None. h11 bounds a head that arrives in
    pieces; one that arrives whole is parsed whatever its size, so the limits are checked here:
    the head's bytes, the number of header fields and the longest field. Its end is the first
    empty line, whether its lines end in CRLF or a bare LF (h11 reads both)."""
    blank = _HEAD_END.search(raw)
    end = -1 if blank is None else blank.start()
    if end < 0 or end > MAX_HEAD_BYTES:
        return f"request head over {MAX_HEAD_BYTES} bytes"
    if len(event.headers) > MAX_HEADERS:
        return f"more than {MAX_HEADERS} header fields"
    if any(len(name) + len(value) + 2 > MAX_HEADER_BYTES for name, value in event.headers):
        return f"a header field over {MAX_HEADER_BYTES} bytes"
    return None


def _is_upgrade(event: h11.Request) -> bool:
    """A GET that asks for a WebSocket: websockets takes it from here, and answers a malformed
    handshake (a missing ``Connection`` or key) as it does."""
    headers = {k.lower(): v.lower() for k, v in event.headers}
    return event.method == b"GET" and b"websocket" in headers.get(b"upgrade", b"")


class HttpDoor(asyncio.Protocol):
    """One accepted connection until it is known to be plain HTTP or a WebSocket upgrade."""

    def __init__(self, listener: Listener) -> None:
        self.listener = listener
        self.transport: asyncio.Transport | None = None
        self.h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)
        self.raw = bytearray()  # what arrived before the hand-off (a WebSocket handshake)
        self.request: h11.Request | None = None
        self.body = bytearray()
        self.timer: asyncio.TimerHandle | None = None
        self.task: asyncio.Task | None = None
        self._writable = asyncio.Event()
        self._writable.set()
        self._done = False
        self.over_limit = False  # accepted over server.max_connections: probes only

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        over = self.listener.over_limit()
        if over > PROBE_ROOM:  # no room even for a probe: the limit's answer, unread, and close
            self._done = True
            transport.write(_FULL_NOW)  # type: ignore[attr-defined]
            transport.close()
            return
        self.over_limit = over > 0
        self.listener.doors.add(self)
        self.timer = asyncio.get_running_loop().call_later(HEAD_TIMEOUT_S, self._timed_out)

    def data_received(self, data: bytes) -> None:
        if self._done:
            return
        if self.request is None:
            self.raw += data
        self.h11.receive_data(data)
        try:
            self._next_events()
        except h11.RemoteProtocolError as exc:
            status = exc.error_status_hint or http.HTTPStatus.BAD_REQUEST
            self._finish(text(status, f"bad request: {exc}\n"))

    def eof_received(self) -> bool | None:
        """The client closed its sending side. With a whole request in hand, keep the connection
        to answer it (a client may half-close after its request); otherwise close."""
        if self.task is not None:
            return True
        self.h11.receive_data(b"")
        try:
            self._next_events()
        except h11.RemoteProtocolError:
            pass
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.listener.doors.discard(self)
        self._writable.set()
        if self.timer is not None:
            self.timer.cancel()
        if self.task is not None and not self.task.done():
            self.task.cancel()  # the client went away: stop the handler (and its stream)

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    # ------------------------------------------------------------ reading

    def _next_events(self) -> None:
        while True:
            event = self.h11.next_event()
            if event is h11.NEED_DATA or event is h11.PAUSED:
                return
            if isinstance(event, h11.Request):
                self.request = event
                too_large = head_too_large(event, self.raw)
                if too_large is not None:
                    self._finish(
                        text(http.HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, f"{too_large}\n")
                    )
                    return
                refused = self._unknown_host(event) or self._full(event)
                if refused is not None:
                    self._finish(refused)
                    return
                if _is_upgrade(event):
                    self._hand_to_websockets()
                    return
                length = {k.lower(): v for k, v in event.headers}.get(b"content-length")
                if length is not None and int(length) > self.listener.max_body_bytes:
                    self._finish(
                        text(
                            http.HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                            f"body over {self.listener.max_body_bytes} bytes\n",
                        )
                    )
                    return
            elif isinstance(event, h11.Data):
                self.body += event.data
                if len(self.body) > self.listener.max_body_bytes:
                    self._finish(
                        text(
                            http.HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                            f"body over {self.listener.max_body_bytes} bytes\n",
                        )
                    )
                    return
            elif isinstance(event, h11.EndOfMessage):
                self._dispatch()
                return
            elif isinstance(event, h11.ConnectionClosed):
                self._close()
                return

    def _full(self, event: h11.Request) -> HttpResponse | None:
        """503 for a request (a WebSocket upgrade too) on a connection accepted over
        ``server.max_connections``, unless it is a health or readiness probe."""
        if not self.over_limit or route_path(event.target.decode("latin-1"))[0] in PROBE_PATHS:
            return None
        return text(
            http.HTTPStatus.SERVICE_UNAVAILABLE,
            f"connection limit ({self.listener.max_open}) reached\n",
            [("Retry-After", "1")],
        )

    def _unknown_host(self, event: h11.Request) -> HttpResponse | None:
        """The refusal of a request whose ``Host`` this server does not answer to (DNS
        rebinding: 403), or that names two hosts (400); None to go on."""
        hosts = [v.decode("latin-1") for k, v in event.headers if k.lower() == b"host"]
        if len(hosts) > 1:
            return text(http.HTTPStatus.BAD_REQUEST, "more than one Host header\n")
        host = hosts[0] if hosts else None
        if host is None or host_allowed(host, self.listener.allowed_hosts):
            return None
        log.info("refused a request for host %r (server.allowed_hosts)", host[:100])
        return text(
            http.HTTPStatus.FORBIDDEN, f"host {host[:100]!r} not allowed (server.allowed_hosts)\n"
        )

    def _hand_to_websockets(self) -> None:
        """Give the connection, and the bytes read so far, to a websockets connection."""
        if self.timer is not None:
            self.timer.cancel()
        self._done = True
        self.listener.doors.discard(self)
        conn = self.listener.websocket_connection()
        assert self.transport is not None
        self.transport.set_protocol(conn)
        conn.connection_made(self.transport)
        conn.data_received(bytes(self.raw))

    def _dispatch(self) -> None:
        assert self.request is not None and self.transport is not None
        if self.timer is not None:
            self.timer.cancel()
        self.transport.pause_reading()  # one request per connection
        path, query = route_path(self.request.target.decode("latin-1"))
        headers: dict[str, str] = {}
        for name, value in self.request.headers:
            key, val = name.decode("latin-1").lower(), value.decode("latin-1")
            headers[key] = f"{headers[key]}, {val}" if key in headers else val
        request = HttpRequest(
            self.request.method.decode("ascii"), path, query, headers, bytes(self.body)
        )
        self.task = asyncio.ensure_future(self._respond(request))

    # ------------------------------------------------------------ answering

    async def _respond(self, request: HttpRequest) -> None:
        routes = self.listener.routes
        if request.method == "OPTIONS" and request.header("Access-Control-Request-Method"):
            await self._send(routes.preflight(request))
            return
        found = routes.find(request.method, request.path)
        try:
            response = found if isinstance(found, HttpResponse) else await found(request)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("%s %s failed", request.method, request.path)
            response = text(http.HTTPStatus.INTERNAL_SERVER_ERROR, "internal error\n")
        response = routes.with_cors(request, response)
        log.debug("%s %s -> %d", request.method, request.path, response.status)
        await self._send(response)

    async def _send(self, response: HttpResponse) -> None:
        headers = [
            ("Server", SERVER_NAME),
            ("Content-Type", response.content_type),
            ("Cache-Control", "no-store"),
            ("Connection", "close"),
            *response.headers,
        ]
        if response.stream is None:
            headers.append(("Content-Length", str(len(response.body))))
        self._write(
            h11.Response(
                status_code=response.status, headers=headers, reason=_reason(response.status)
            )
        )
        if response.stream is None:
            if response.body:
                self._write(h11.Data(data=response.body))
        else:
            try:
                async for chunk in response.stream:
                    if self.transport is None or self.transport.is_closing():
                        break
                    self._write(h11.Data(data=chunk))
                    await self._writable.wait()  # a slow reader holds the stream, not memory
            finally:
                closer = getattr(response.stream, "aclose", None)
                if closer is not None:
                    await closer()
        self._write(h11.EndOfMessage())
        self._close()

    def _finish(self, response: HttpResponse) -> None:
        """Answer at once (a refusal while reading) and close."""
        self._done = True
        if self.timer is not None:
            self.timer.cancel()
        if self.h11.our_state in (h11.IDLE, h11.SEND_RESPONSE):
            self.task = asyncio.ensure_future(self._send(response))
        else:
            self._close()

    def _write(self, event) -> None:
        if self.transport is not None and not self.transport.is_closing():
            try:
                data = self.h11.send(event)
            except h11.LocalProtocolError:
                return
            if data:
                self.transport.write(data)

    def _timed_out(self) -> None:
        log.debug("request not complete within %.0f s: closing", HEAD_TIMEOUT_S)
        self._finish(text(http.HTTPStatus.REQUEST_TIMEOUT, "request timed out\n"))

    def _close(self) -> None:
        self._done = True
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()


_FULL_NOW = (
    b"HTTP/1.1 503 Service Unavailable\r\nServer: voicert\r\nContent-Type: text/plain\r\n"
    b"Retry-After: 1\r\nConnection: close\r\nContent-Length: 25\r\n\r\n"
    b"connection limit reached\n"
)


def _reason(status: int) -> bytes:
    try:
        return http.HTTPStatus(status).phrase.encode()
    except ValueError:
        return b""


class Listener:
    """The listening socket: plain HTTP through :class:`Routes`, WebSocket upgrades through a
    websockets :class:`Server` (``ws_server``: its handler, ``process_request`` and limits)."""

    def __init__(
        self,
        routes: Routes,
        ws_server: Server,
        max_body_bytes: int,
        ws_options: dict,
        allowed_hosts: tuple[str, ...] = ("*",),
        max_open: int = 0,
    ) -> None:
        """``allowed_hosts``: see :func:`~voicert.server.access.host_allowed` (a request naming
        another host gets 403 before it is routed). ``max_open``: open connections, plain HTTP
        and WebSocket alike (``server.max_connections``; 0: no limit). A connection over it gets
        503 with ``Retry-After`` (health and readiness probes are still answered on up to
        :data:`PROBE_ROOM` more), so a flood of sockets cannot take the descriptors the
        sessions, the models and the probes need."""
        self.routes = routes
        self.allowed_hosts = allowed_hosts
        self.ws_server = ws_server
        self.max_body_bytes = max_body_bytes
        self.ws_options = ws_options  # max_size, ping_interval, ... as serve() takes them
        self.doors: set[HttpDoor] = set()
        self.server: asyncio.Server | None = None
        self.max_open = max_open

    def over_limit(self) -> int:
        """How many connections, this one included, are open beyond ``max_open`` (0: none)."""
        if not self.max_open:
            return 0
        return max(len(self.doors) + len(self.ws_server.handlers) + 1 - self.max_open, 0)

    async def start(self, host: str, port: int, sock: socket.socket | None = None) -> None:
        """Listen at ``host:port``, or on ``sock`` (bound and listening already: a worker's
        share of the port) when given."""
        loop = asyncio.get_running_loop()
        if sock is not None:
            self.server = await loop.create_server(lambda: HttpDoor(self), sock=sock)
        else:
            self.server = await loop.create_server(lambda: HttpDoor(self), host, port)
        self.ws_server.wrap(self.server)

    def websocket_connection(self) -> ServerConnection:
        """A websockets connection, made as ``websockets.asyncio.server.serve`` makes one."""
        o = self.ws_options
        protocol = ServerProtocol(max_size=o.get("max_size"), logger=self.ws_server.logger)
        return ServerConnection(
            protocol,
            self.ws_server,
            ping_interval=o.get("ping_interval", 20),
            ping_timeout=o.get("ping_timeout", 20),
            close_timeout=o.get("close_timeout", 10),
            max_queue=o.get("max_queue", 16),
            write_limit=o.get("write_limit", 2**15),
        )

    @property
    def port(self) -> int:
        assert self.server is not None
        return self.server.sockets[0].getsockname()[1]

    def close(self, close_connections: bool = True) -> None:
        """Stop accepting. With ``close_connections``, plain requests in flight are aborted too
        (else see :meth:`abort_requests`); WebSockets as websockets' ``Server.close`` does."""
        self.ws_server.close(close_connections=close_connections)
        if close_connections:
            self.abort_requests()

    async def wait_requests(self, timeout: float) -> None:
        """Wait up to ``timeout`` for the plain HTTP requests in flight to be answered."""
        tasks = [d.task for d in list(self.doors) if d.task is not None and not d.task.done()]
        if tasks:
            await asyncio.wait(tasks, timeout=timeout)

    def abort_requests(self) -> None:
        """Abort the plain HTTP requests still in flight (their handlers are cancelled)."""
        for door in list(self.doors):
            if door.transport is not None:
                door.transport.abort()

    async def wait_closed(self) -> None:
        await self.ws_server.wait_closed()
