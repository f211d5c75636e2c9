"""The native-protocol connection: a thin adapter between a websockets connection and a Session."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid

from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed

from voicert.agent.session import Services, Session
from voicert.config import SUPPORTED_SAMPLE_RATES
from voicert.protocol import native as p
from voicert.server.access import RateLimiter

log = logging.getLogger(__name__)

CLOSE_NORMAL = 1000
CLOSE_GOING_AWAY = 1001
CLOSE_POLICY = 1008  # a reader too slow to drain its frames; a sender over the message rate


class BaseConnection:
    """What every front door shares: sending with a slow-reader timeout, the read loop with the
    message-rate limit, error handling, and closing the session when the socket goes.
    Subclasses decode frames in :meth:`dispatch` and report client mistakes in :meth:`reject`."""

    client_errors: tuple[type[Exception], ...] = (p.ProtocolError,)

    def __init__(self, ws: ServerConnection, services: Services) -> None:
        self.ws = ws
        self.svc = services
        self.session: Session | None = None
        self.closed = False

    async def send_frame(self, frame: bytes | str) -> None:
        """Send one frame; a closed socket is ignored, a reader too slow to drain one frame within
        ``server.send_timeout_s`` is disconnected (its turn is then cancelled by the read loop)."""
        if self.closed:
            return
        try:
            await asyncio.wait_for(self.ws.send(frame), self.svc.cfg.server.send_timeout_s)
        except ConnectionClosed:
            self.closed = True
        except TimeoutError:
            if self.closed:
                return  # another send already gave up on this reader
            log.warning("connection %s: slow reader, closing", self.ws.id)
            self.closed = True
            self.svc.metrics.observe_error("slow_reader")
            if self.session is not None:
                self.session.cancel_response()  # free the engine now, not when the socket goes
            asyncio.ensure_future(self.ws.close(CLOSE_POLICY, "slow reader"))

    async def dispatch(self, frame: bytes | str) -> bool:
        """Handle one client message; True when the session has ended. May raise client_errors."""
        raise NotImplementedError

    async def reject(self, exc: Exception) -> None:
        """Tell the client about a mistake (one of ``client_errors``); the session goes on."""
        raise NotImplementedError

    async def fatal(self, code: p.ErrorCode, message: str) -> None:
        """Tell the client the connection is about to close because of ``code``."""
        raise NotImplementedError

    async def run(self) -> None:
        s = self.svc.cfg.server
        limiter = RateLimiter(s.max_messages_per_s, s.message_burst)
        closing = None
        try:
            async for frame in self.ws:
                if closing is not None:
                    continue  # drain what the client already sent so its close reply can arrive
                if not limiter.allow(time.monotonic()):
                    self.svc.metrics.observe_error(p.ErrorCode.RATE_LIMITED.value)
                    await self.fatal(p.ErrorCode.RATE_LIMITED,
                                     f"more than {s.max_messages_per_s:g} messages/s")
                    closing = asyncio.ensure_future(self.ws.close(CLOSE_POLICY, "message rate limit"))
                    continue
                try:
                    if await self.dispatch(frame):
                        break
                except self.client_errors as exc:
                    await self.reject(exc)
        except ConnectionClosed:
            pass
        except Exception:
            log.exception("connection %s: internal error", self.ws.id)
            self.svc.metrics.observe_error(p.ErrorCode.INTERNAL.value)
            await self.fatal(p.ErrorCode.INTERNAL, "internal server error")
            await self.ws.close(1011, "internal error")
        finally:
            self.closed = self.closed or self.ws.state.name != "OPEN"
            if self.session is not None:
                await self.session.close()
                self.svc.metrics.session_ended()
            await self.on_closed()

    async def on_closed(self) -> None:
        """Called once after the read loop ends and the session is closed."""


class Connection(BaseConnection):
    """The native protocol (``/v1/stream``, docs/protocol.md)."""

    def __init__(self, ws: ServerConnection, services: Services) -> None:
        super().__init__(ws, services)
        self.binary = True  # reply in the frame kind the client used for session.start

    async def send(self, event: p.ServerEvent) -> None:
        if isinstance(event, p.Error):
            self.svc.metrics.observe_error(event.code)
        await self.send_frame(p.encode(event, self.binary))

    async def error(self, code: p.ErrorCode, message: str, fatal: bool = False) -> None:
        await self.send(p.Error(code.value, message, fatal))

    async def reject(self, exc: Exception) -> None:
        await self.error(exc.code, exc.message)

    async def fatal(self, code: p.ErrorCode, message: str) -> None:
        await self.send_frame(p.encode(p.Error(code.value, message, True), self.binary))

    async def dispatch(self, frame: bytes | str) -> bool:
        event = p.decode_client(frame)
        if isinstance(event, p.SessionStart):
            await self._start(event, binary=isinstance(frame, bytes))
            return False
        if self.session is None:
            raise p.ProtocolError(p.ErrorCode.NO_SESSION,
                                  f"'{event.type}' before 'session.start'")
        if isinstance(event, p.Audio):
            await self.session.on_audio(event.audio)
        elif isinstance(event, p.AudioCommit):
            self.session.commit()
        elif isinstance(event, p.ResponseCancel):
            self.session.cancel_response()
        elif isinstance(event, p.UserText):
            if not event.text.strip():
                raise p.ProtocolError(p.ErrorCode.INVALID, "user.text: 'text' is empty")
            self.session.add_user_text(event.text)
            if event.respond:
                self.session.respond()
        elif isinstance(event, p.SessionEnd):
            await self.session.wait_turn(self.svc.cfg.server.shutdown_grace_s)
            await self.session.close()
            await self.send(p.SessionEnded("client_ended"))
            await self.ws.close(CLOSE_NORMAL)
            return True
        return False

    async def _start(self, start: p.SessionStart, binary: bool) -> None:
        self.binary = binary
        if self.session is not None:
            raise p.ProtocolError(p.ErrorCode.ALREADY_STARTED, "session already started")
        check_format(start.encoding, start.sample_rate, "")
        check_output_audio(start.output_audio, self.svc)
        if self.svc.draining:
            raise p.ProtocolError(p.ErrorCode.SHUTTING_DOWN, "server is shutting down")
        sid = uuid.uuid4().hex[:12]
        self.session = Session(sid, start, self.svc, self.send)
        self.svc.metrics.session_started()
        await self.send(p.SessionStarted(sid, start.sample_rate, start.encoding,
                                         start.turn_detection, start.output_audio))


def check_output_audio(fmt: p.OutputAudio | None, svc: Services) -> None:
    """Raises ProtocolError unless the server can speak in ``fmt`` (or no speech was asked for)."""
    if fmt is None:
        return
    if svc.tts is None:
        raise p.ProtocolError(p.ErrorCode.NO_SPEECH_OUTPUT,
                              "this server has no speech output (tts.engine is none)")
    check_format(fmt.encoding, fmt.sample_rate, "output_audio.")


def check_format(encoding: str, rate: int, prefix: str) -> None:
    """Raises ProtocolError for an audio encoding or sample rate the server does not take."""
    if rate not in SUPPORTED_SAMPLE_RATES:
        raise p.ProtocolError(p.ErrorCode.UNSUPPORTED_SAMPLE_RATE,
                              f"{prefix}sample_rate {rate} not supported "
                              f"(supported: {', '.join(map(str, SUPPORTED_SAMPLE_RATES))})")
    if encoding not in p.ENCODINGS:
        raise p.ProtocolError(p.ErrorCode.UNSUPPORTED_ENCODING,
                              f"{prefix}encoding {encoding[:32]!r} not supported "
                              f"(supported: {', '.join(p.ENCODINGS)})")
