"""The native-protocol connection: a thin adapter between a websockets connection and a Session."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import time
import uuid

from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed

from voicert.agent.session import Services, Session
from voicert.config import SUPPORTED_SAMPLE_RATES, ConfigError, TurnConfig, VadConfig
from voicert.core import events as ev
from voicert.core.bucket import TokenBucket
from voicert.core.session import ENCODINGS, SessionSettings
from voicert.protocol import native as p
from voicert.server import offloop
from voicert.server.completions import served_model_id
from voicert.telemetry.latency import now_ns
from voicert.transport.spoken import PacingClock, bytes_per_ms

log = logging.getLogger(__name__)

CLOSE_NORMAL = 1000
CLOSE_GOING_AWAY = 1001
CLOSE_UNSUPPORTED_DATA = 1003  # a message of a kind this socket does not take
CLOSE_POLICY = 1008  # a reader too slow to drain its frames; a sender over the message rate
CLOSE_TRY_AGAIN = 1013  # the server has no room for another session now
# the reader waited this long for a message: none was buffered, so the caller's audio is read as
# it comes (a buffered one returns at once, without a suspension)
READER_IDLE_NS = 1_000_000


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
        self.claimed = False  # this connection counts against server.max_sessions
        self.opened_at = self.last_message = 0.0  # loop times: socket opened, client's last message
        self._watchdog: asyncio.TimerHandle | None = None
        self._detached: set[asyncio.Task] = set()  # time-outs and closes not waited for

    def _detach(self, coro) -> None:
        """Run ``coro`` to its end without waiting for it, holding its task until then."""
        task = asyncio.ensure_future(coro)
        self._detached.add(task)
        task.add_done_callback(self._detached.discard)

    @property
    def started(self) -> Session:
        """The session, for handlers that need one (ProtocolError NO_SESSION before it)."""
        if self.session is None:
            raise p.ProtocolError(p.ErrorCode.NO_SESSION, "the session has not started")
        return self.session

    def claim_session(self) -> None:
        """Count this connection's session against ``server.max_sessions``; raises
        ProtocolError(SESSION_LIMIT) when there is no room (sockets without a session don't count)."""
        limit = self.svc.cfg.server.max_sessions
        if self.svc.metrics.active_sessions >= limit:
            self.svc.metrics.observe_error(p.ErrorCode.SESSION_LIMIT.value)
            raise p.ProtocolError(
                p.ErrorCode.SESSION_LIMIT,
                f"the server is at its session limit ({limit}); try again later",
            )
        self.claimed = True
        self.svc.metrics.session_started()

    def release_session(self) -> None:
        if self.claimed:
            self.claimed = False
            self.svc.metrics.session_ended()

    # ------------------------------------------------------------ timeouts

    def _arm_watchdog(self) -> None:
        """One timer per connection (not one per message). When it fires, a socket without a
        session past ``server.start_timeout_s``, or a session whose client has sent nothing for
        ``server.idle_timeout_s`` while no reply runs, is closed; otherwise it re-arms."""
        if self._watchdog is not None:
            self._watchdog.cancel()
        self._watchdog = asyncio.get_running_loop().call_at(self._deadline(), self._on_watchdog)

    def _deadline(self) -> float:
        s = self.svc.cfg.server
        if self.session is None:
            return self.opened_at + s.start_timeout_s
        return min(self.last_message + s.idle_timeout_s, self._voice_deadline())

    def _voice_deadline(self) -> float:
        """When the session has gone ``server.voice_idle_timeout_s`` without speech, text or a
        reply (a client that streams only silence holds its slot no longer), in loop time."""
        limit = self.svc.cfg.server.voice_idle_timeout_s
        if not limit or self.session is None:
            return math.inf
        quiet_s = (now_ns() - self.session.activity_ns) / 1e9
        return asyncio.get_running_loop().time() - quiet_s + limit

    def _on_watchdog(self) -> None:
        self._watchdog = None
        if self.closed:
            return
        s = self.svc.cfg.server
        now = asyncio.get_running_loop().time()
        if now < self._deadline():
            self._arm_watchdog()
        elif self.session is None:
            self._detach(
                self._time_out(
                    p.ErrorCode.START_TIMEOUT,
                    f"no session started within {s.start_timeout_s:g} s",
                    CLOSE_POLICY,
                )
            )
        elif not self.session.idle():  # a reply still running is activity
            self.last_message = now
            self.session.touch()
            self._arm_watchdog()
        else:
            quiet = now >= self._voice_deadline()
            why = (
                f"no speech or text for {s.voice_idle_timeout_s:g} s"
                if quiet
                else f"nothing received for {s.idle_timeout_s:g} s"
            )
            self._detach(self._time_out(p.ErrorCode.IDLE_TIMEOUT, why, CLOSE_NORMAL))

    async def _time_out(self, code: p.ErrorCode, message: str, close_code: int) -> None:
        log.info("connection %s: %s: closing", self.ws.id, message)
        self.svc.metrics.observe_error(code.value)
        await self.fatal(code, message)
        self.closed = True
        await self.ws.close(close_code, code.value)

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
            self._detach(self._close_slow_reader())

    async def _close_slow_reader(self) -> None:
        """Close 1008 if the close frame gets through within ``send_timeout_s``; else drop the
        socket (a reader that does not drain cannot take the close frame either: websockets would
        wait on it until its keep-alive gives up, 20 s and more)."""
        try:
            await asyncio.wait_for(
                self.ws.close(CLOSE_POLICY, "slow reader"), self.svc.cfg.server.send_timeout_s
            )
        except TimeoutError:
            self.ws.transport.abort()

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
        limiter = TokenBucket(s.max_messages_per_s, s.message_burst)
        volume = TokenBucket(s.max_bytes_per_s, s.byte_burst)
        closing = None
        loop = asyncio.get_running_loop()
        self.opened_at = self.last_message = loop.time()
        self._arm_watchdog()
        frames = aiter(self.ws)
        try:
            while True:
                asked = time.perf_counter_ns()
                try:
                    frame = await anext(frames)
                except StopAsyncIteration:
                    break
                if time.perf_counter_ns() - asked >= READER_IDLE_NS and self.session is not None:
                    self.session.caller_idle()  # nothing was waiting: this one comes as sent
                self.last_message = loop.time()
                if closing is not None:
                    continue  # drain what the client already sent so its close reply can arrive
                over = self._over_rate(limiter, volume, len(frame), time.monotonic())
                if over is not None:
                    self.svc.metrics.observe_error(p.ErrorCode.RATE_LIMITED.value)
                    await self.fatal(p.ErrorCode.RATE_LIMITED, over)
                    closing = asyncio.ensure_future(self.ws.close(CLOSE_POLICY, "rate limit"))
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
            if self._watchdog is not None:
                self._watchdog.cancel()
            self.closed = self.closed or self.ws.state.name != "OPEN"
            if self.session is not None:
                await self.session.close()
            self.release_session()
            await self.on_closed()

    def _over_rate(
        self, messages: TokenBucket, volume: TokenBucket, size: int, now: float
    ) -> str | None:
        """Why this frame is over the connection's rates (``server.max_messages_per_s``,
        ``server.max_bytes_per_s``), or None: it is taken from both."""
        s = self.svc.cfg.server
        if not messages.allow(now):
            return f"more than {s.max_messages_per_s:g} messages/s"
        if not volume.take(size, now):
            return f"more than {s.max_bytes_per_s:g} bytes/s (bursts of {s.byte_burst})"
        return None

    async def on_closed(self) -> None:
        """Called once after the read loop ends and the session is closed."""


class Connection(BaseConnection):
    """The native protocol (``/v1/stream``, docs/protocol.md)."""

    def __init__(self, ws: ServerConnection, services: Services) -> None:
        super().__init__(ws, services)
        self.binary = True  # reply in the frame kind the client used for session.start
        self.clock = PacingClock()  # what the client has heard of a spoken reply

    async def send(self, event: p.ServerEvent) -> None:
        if isinstance(event, p.Error):
            self.svc.metrics.observe_error(event.code)
        await self.send_frame(p.encode(event, self.binary))

    async def on_event(self, event: ev.SessionEvent) -> None:
        """The session's events, on the native wire."""
        self._pace(event)
        await self.send(p.from_core(event))

    def _pace(self, event: ev.SessionEvent) -> None:
        """A spoken reply the caller talked over keeps, in the conversation, only what had played
        by the server's pacing clock (transport/spoken.py)."""
        clock = self.clock
        cut = None
        if isinstance(event, ev.ReplyStarted) and event.spoken:
            fmt = self.started.settings.output_audio
            if fmt is not None:
                clock.started(event.turn_id, bytes_per_ms(fmt.encoding, fmt.sample_rate))
        elif isinstance(event, ev.ReplyAudio):
            clock.audio(event.turn_id, event.audio, event.text, time.perf_counter_ns())
        elif isinstance(event, ev.BargeIn):
            cut = clock.speech_started(time.perf_counter_ns())  # a reply sent, still playing
        elif isinstance(event, ev.ReplyDone):
            cut = clock.done(
                event.turn_id,
                event.text,
                event.item_id,
                event.finish_reason == ev.ReplyEnd.INTERRUPTED,
                event.item_offset,
            )
        if cut is not None and cut.cut_ms is not None:
            self.started.keep_heard(cut.item_id, cut.heard_chars(cut.cut_ms), cut.item_offset)

    async def error(self, code: p.ErrorCode, message: str, fatal: bool = False) -> None:
        await self.send(p.Error(code.value, message, fatal))

    async def reject(self, exc: Exception) -> None:
        assert isinstance(exc, p.ProtocolError)  # this door's one client error
        await self.error(exc.code, exc.message)

    async def fatal(self, code: p.ErrorCode, message: str) -> None:
        await self.send_frame(p.encode(p.Error(code.value, message, True), self.binary))

    async def dispatch(self, frame: bytes | str) -> bool:
        event = await offloop.decode(p.decode_client, frame)
        if isinstance(event, p.SessionStart):
            await self._start(event, binary=isinstance(frame, bytes))
            return False
        if self.session is None:
            raise p.ProtocolError(p.ErrorCode.NO_SESSION, f"'{event.type}' before 'session.start'")
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
        elif isinstance(event, p.SessionUpdate):
            if event.voice is not None:
                self.session.set_voice(event.voice)
            self.session.set_tools(event.tools, event.tool_choice)
            if event.system_prompt is not None:
                self.session.set_system_prompt(event.system_prompt)
        elif isinstance(event, p.ToolResultIn):
            self._tool_result(event)
        elif isinstance(event, p.SessionEnd):
            await self.session.wait_turn(self.svc.cfg.server.shutdown_grace_s)
            await self.session.close()
            await self.send(p.SessionEnded("client_ended"))
            await self.ws.close(CLOSE_NORMAL)
            return True
        return False

    def _tool_result(self, event: p.ToolResultIn) -> None:
        """A client tool's output joins the conversation; once no call waits any more (and the
        client asks for it), the reply goes on."""
        try:
            self.started.add_tool_output(event.call_id, event.output)
        except KeyError:
            raise p.ProtocolError(
                p.ErrorCode.INVALID, f"tool.result: no call has call_id {event.call_id[:64]!r}"
            ) from None
        if event.respond and not self.started.waiting_calls():
            self.started.respond()

    async def _start(self, start: p.SessionStart, binary: bool) -> None:
        self.binary = binary
        if self.session is not None:
            raise p.ProtocolError(p.ErrorCode.ALREADY_STARTED, "session already started")
        check_format(start.encoding, start.sample_rate, "")
        check_output_audio(start.output_audio, self.svc)
        if self.svc.draining:
            raise p.ProtocolError(p.ErrorCode.SHUTTING_DOWN, "server is shutting down")
        try:
            self.claim_session()
        except p.ProtocolError as exc:
            await self.fatal(exc.code, exc.message)
            self.closed = True
            await self.ws.close(CLOSE_TRY_AGAIN, "session limit reached")
            return
        sid = uuid.uuid4().hex[:12]
        try:
            vad, turn = session_turn_taking(start, self.svc)
            self.session = Session(sid, start, self.svc, self.on_event, vad=vad, turn=turn)
        except p.ProtocolError:
            self.release_session()
            raise
        self._arm_watchdog()  # the idle timeout from now on
        tts = self.svc.tts
        await self.send(
            p.SessionStarted(
                sid,
                start.sample_rate,
                start.encoding,
                start.turn_detection,
                start.output_audio,
                voice=None if tts is None else (self.session.voice or tts.default_voice),
                voices=() if tts is None else tuple(tts.voices),
                model=served_model_id(self.svc.cfg),
            )
        )


def check_output_audio(fmt: p.OutputAudio | None, svc: Services) -> None:
    """Raises ProtocolError unless the server can speak in ``fmt`` (or no speech was asked for)."""
    if fmt is None:
        return
    if svc.tts is None:
        raise p.ProtocolError(
            p.ErrorCode.NO_SPEECH_OUTPUT, "this server has no speech output (tts.engine is none)"
        )
    check_format(fmt.encoding, fmt.sample_rate, "output_audio.")


def check_format(encoding: str, rate: int, prefix: str) -> None:
    """Raises ProtocolError for an audio encoding or sample rate the server does not take."""
    if rate not in SUPPORTED_SAMPLE_RATES:
        raise p.ProtocolError(
            p.ErrorCode.UNSUPPORTED_SAMPLE_RATE,
            f"{prefix}sample_rate {rate} not supported "
            f"(supported: {', '.join(map(str, SUPPORTED_SAMPLE_RATES))})",
        )
    if encoding not in ENCODINGS:
        raise p.ProtocolError(
            p.ErrorCode.UNSUPPORTED_ENCODING,
            f"{prefix}encoding {encoding[:32]!r} not supported (supported: {', '.join(ENCODINGS)})",
        )


def session_turn_taking(start: SessionSettings, svc: Services) -> tuple[VadConfig, TurnConfig]:
    """The server's VAD and turn settings with a native session's own (``options.end_of_turn``,
    ``silence_ms``, ``vad_threshold``) applied. ``silence_ms`` is the endpoint silence of the
    silence detector, or the semantic detector's longest wait after an incomplete utterance.
    Raises ``ProtocolError`` (invalid) for a combination the settings refuse."""
    vad, turn = svc.cfg.vad, svc.cfg.turn
    try:
        if start.vad_threshold is not None:
            vad = dataclasses.replace(
                vad,
                threshold=start.vad_threshold,
                neg_threshold=min(vad.neg_threshold, start.vad_threshold),
            )
        if start.end_of_turn is not None and start.end_of_turn != turn.detector:
            turn = dataclasses.replace(turn, detector=start.end_of_turn)
            if turn.detector != "silence" and svc.turn_judge is None:  # no audio model loaded
                turn = dataclasses.replace(
                    turn, model="none", text_cue=turn.text_cue or turn.detector == "semantic"
                )
        if start.silence_ms is not None:
            if turn.detector == "silence":
                vad = dataclasses.replace(vad, min_silence_ms=start.silence_ms)
            else:
                turn = dataclasses.replace(turn, max_silence_ms=start.silence_ms)
    except ConfigError as exc:
        raise p.ProtocolError(p.ErrorCode.INVALID, f"options: {exc}") from None
    return vad, turn
