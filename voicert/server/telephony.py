"""The phone door: a telephony provider's media stream onto the session core, with the reply spoken
back. One door for every provider: each is a codec (``voicert.core.telephony.Provider``: Twilio,
Telnyx, Plivo in ``voicert/protocol/``) and one route (``SESSION_ROUTES`` in ``server/app.py``).

The caller's audio (G.711 at 8 kHz, or what the provider's start says and the codec takes) feeds the
session (server VAD, barge-in as on any session); the reply is spoken in the same format and sent
as 20 ms media messages, with a mark after each spoken piece so we know what has actually been
played (the provider echoes a mark once the audio before it has played). When the caller starts
talking while our audio is still queued or playing, we send a clear (the provider drops the
unplayed audio) and the session interrupts the reply if it is still being generated.

Providers have no error channel back: malformed messages are logged and counted and the call goes
on; a call that starts wrong (media before the start, a media format the codec does not take) is
closed with 1008 / 1003 and the reason.
"""

from __future__ import annotations

import functools
import logging

from websockets.asyncio.server import ServerConnection

from voicert.agent.session import Services, Session
from voicert.core import events as core
from voicert.core import telephony as call
from voicert.core.session import OutputAudio, SessionSettings
from voicert.protocol import native as p
from voicert.server.connection import (
    CLOSE_POLICY,
    CLOSE_TRY_AGAIN,
    CLOSE_UNSUPPORTED_DATA,
    BaseConnection,
)
from voicert.transport.spoken import covered_chars
from voicert.transport.telephony import Playback

log = logging.getLogger(__name__)


class PhoneConnection(BaseConnection):
    """One call's media stream, read and written by ``provider``'s codec."""

    client_errors = (call.CallMessageError, p.ProtocolError)

    def __init__(self, ws: ServerConnection, services: Services, provider: call.Provider) -> None:
        super().__init__(ws, services)
        self.provider = provider
        self.stream_id = ""
        self.playback: Playback | None = None  # from the start on
        self.dtmf: list[str] = []

    def _label(self) -> str:
        return f"{self.provider.name} {self.stream_id or self.ws.id}"

    async def reject(self, exc: Exception) -> None:
        message = exc.message if isinstance(exc, p.ProtocolError) else str(exc)
        log.warning("%s: %s", self._label(), message)
        self.svc.metrics.observe_error(f"{self.provider.name}_bad_message")

    async def fatal(self, code: p.ErrorCode, message: str) -> None:
        log.warning("%s: closing: %s", self._label(), message)

    async def dispatch(self, frame: bytes | str) -> bool:
        event = self.provider.decode(frame)
        if isinstance(event, call.CallMedia):
            if self.session is None:
                await self._refuse(CLOSE_POLICY, "media before start")
                return True
            if event.inbound:
                await self.session.on_audio(event.payload)
        elif isinstance(event, call.CallStart):
            return await self._start(event)
        elif isinstance(event, call.CallMark):
            if self.playback is not None:
                self.playback.mark_played(event.name)
        elif isinstance(event, call.CallDtmf):
            self._on_dtmf(event.digit)
        elif isinstance(event, call.CallStop):
            if self.session is not None:
                await self.session.wait_turn(1.0)
            await self.ws.close(1000, "call ended")
            return True
        elif isinstance(event, call.CallNotice) and event.what.startswith("error"):
            log.warning("%s: the provider reports %s", self._label(), event.what)
        return False

    async def _refuse(self, code: int, reason: str) -> None:
        log.warning("%s: %s", self._label(), reason)
        self.svc.metrics.observe_error(f"{self.provider.name}_refused")
        await self.ws.close(code, close_reason(reason))

    async def _start(self, start: call.CallStart) -> bool:
        if self.session is not None:
            raise call.CallMessageError("a second 'start' on one stream")
        if start.refused is not None:
            await self._refuse(CLOSE_UNSUPPORTED_DATA, start.refused)
            return True
        if self.svc.draining:
            await self._refuse(1001, "server shutting down")
            return True
        self.stream_id = start.stream_id
        self.playback = Playback(self.provider.serializer(start))
        out = OutputAudio(start.encoding, start.sample_rate) if self.svc.tts is not None else None
        prompt = start.parameters.get("system_prompt")
        try:
            self.claim_session()
        except p.ProtocolError as exc:
            await self._refuse(CLOSE_TRY_AGAIN, exc.message)
            return True
        try:
            self.session = Session(
                f"{self.provider.name}-{start.call_id or start.stream_id}",
                SessionSettings(start.sample_rate, start.encoding, prompt, output_audio=out),
                self.svc,
                self.on_event,
            )
        except p.ProtocolError as exc:  # e.g. a system_prompt over server.max_text_chars
            self.release_session()
            await self._refuse(CLOSE_POLICY, exc.message)
            return True
        log.info("%s call %s stream %s started", self.provider.name, start.call_id, start.stream_id)
        return False

    def _on_dtmf(self, digit: str) -> None:
        """Key presses join the conversation as a note the agent can read; no reply is forced."""
        self.dtmf.append(digit)
        if self.session is not None:
            self.session.add_user_text(f"(The caller pressed {digit} on the phone keypad.)")

    # ------------------------------------------------------------ session events -> the provider

    async def on_event(self, ev: core.SessionEvent) -> None:
        play, session = self.playback, self.session
        assert play is not None and session is not None  # events come from the session started
        frames: list[str] = []
        if isinstance(ev, core.ReplyAudio):
            frames = play.audio(ev.turn_id, ev.seq, ev.text, ev.audio)
        elif isinstance(ev, core.ReplyDone):
            frames = play.reply_done(ev.turn_id)
            heard = play.heard(ev.turn_id)
            if heard is not None and ev.item_id:  # cut off: keep only what the caller heard
                session.keep_heard(ev.item_id, covered_chars(ev.text, heard), ev.item_offset)
        elif isinstance(ev, core.BargeIn):
            # the caller talks over a reply that is still queued at the provider or playing:
            # the session interrupts it, and the provider drops what it has not played yet
            if self.svc.cfg.vad.barge_in:
                frames = play.speech_started(ev.turn_id)
        elif isinstance(ev, core.SessionError):
            self.svc.metrics.observe_error(ev.code)
            log.warning("%s: %s: %s", self._label(), ev.code, ev.message)
        for frame in frames:
            await self.send_frame(frame)


def close_reason(text: str, limit: int = 123) -> str:
    """``text`` cut to what a close frame carries (123 bytes of UTF-8), on a character."""
    raw = text.encode()
    return text if len(raw) <= limit else raw[: limit - 3].decode(errors="ignore") + "..."


def phone_door(provider: call.Provider):
    """The door of ``provider``'s media streams, as ``SESSION_ROUTES`` takes it."""
    return functools.partial(PhoneConnection, provider=provider)
