"""``/twilio``: Twilio Media Streams onto the session core, with the reply spoken back.

The caller's mu-law audio feeds the session (server VAD, barge-in as on any session); the reply is
spoken in mu-law 8 kHz and sent as 20 ms ``media`` messages, with a ``mark`` after each spoken piece
so we know what has actually been played (Twilio echoes a mark once the audio before it has played).
When the caller starts talking while our audio is still queued or playing, we send ``clear`` (Twilio
drops the unplayed audio) and the session interrupts the reply if it is still being generated.

Twilio has no error channel back to it: malformed messages are logged and counted and the call goes
on; a call that starts wrong (media before ``start``, a media format other than mu-law 8 kHz mono)
is closed with 1008 / 1003 and the reason.
"""

from __future__ import annotations

import logging

from websockets.asyncio.server import ServerConnection

from voicert.agent.session import Services, Session
from voicert.core import events as core
from voicert.core.session import OutputAudio, SessionSettings
from voicert.protocol import native as p
from voicert.protocol import twilio as tw
from voicert.server.connection import CLOSE_POLICY, CLOSE_TRY_AGAIN, BaseConnection
from voicert.transport.spoken import covered_chars
from voicert.transport.telephony import Playback

log = logging.getLogger(__name__)
TWILIO_PATH = "/twilio"
CLOSE_UNSUPPORTED_DATA = 1003


class TwilioConnection(BaseConnection):
    client_errors = (tw.TwilioError, p.ProtocolError)

    def __init__(self, ws: ServerConnection, services: Services) -> None:
        super().__init__(ws, services)
        self.stream_sid = ""
        self.playback: Playback | None = None  # from 'start' on
        self.dtmf: list[str] = []

    async def reject(self, exc: Exception) -> None:
        message = exc.message if isinstance(exc, p.ProtocolError) else str(exc)
        log.warning("twilio %s: %s", self.stream_sid or self.ws.id, message)
        self.svc.metrics.observe_error("twilio_bad_message")

    async def fatal(self, code: p.ErrorCode, message: str) -> None:
        log.warning("twilio %s: closing: %s", self.stream_sid or self.ws.id, message)

    async def dispatch(self, frame: bytes | str) -> bool:
        event = tw.decode_inbound(frame)
        if isinstance(event, tw.Media):
            if self.session is None:
                await self._refuse(CLOSE_POLICY, "media before start")
                return True
            if event.track in ("inbound", "inbound_track"):
                await self.session.on_audio(event.payload)
        elif isinstance(event, tw.Start):
            return await self._start(event)
        elif isinstance(event, tw.Mark):
            if self.playback is not None:
                self.playback.mark_played(event.name)
        elif isinstance(event, tw.Dtmf):
            self._on_dtmf(event.digit)
        elif isinstance(event, tw.Stop):
            if self.session is not None:
                await self.session.wait_turn(1.0)
            await self.ws.close(1000, "call ended")
            return True
        return False

    async def _refuse(self, code: int, reason: str) -> None:
        log.warning("twilio %s: %s", self.stream_sid or self.ws.id, reason)
        self.svc.metrics.observe_error("twilio_refused")
        await self.ws.close(code, reason)

    async def _start(self, start: tw.Start) -> bool:
        if self.session is not None:
            raise tw.TwilioError("a second 'start' on one stream")
        if (start.encoding, start.sample_rate, start.channels) != (tw.MULAW, tw.SAMPLE_RATE, 1):
            await self._refuse(
                CLOSE_UNSUPPORTED_DATA,
                f"unsupported media format {start.encoding} {start.sample_rate} Hz "
                f"x{start.channels} (expected {tw.MULAW} 8000 Hz mono)",
            )
            return True
        if self.svc.draining:
            await self._refuse(1001, "server shutting down")
            return True
        self.stream_sid = start.stream_sid
        self.playback = Playback(tw.Serializer(start.stream_sid))
        out = OutputAudio("mulaw", tw.SAMPLE_RATE) if self.svc.tts is not None else None
        prompt = start.custom_parameters.get("system_prompt")
        try:
            self.claim_session()
        except p.ProtocolError as exc:
            await self._refuse(CLOSE_TRY_AGAIN, exc.message)
            return True
        try:
            self.session = Session(
                f"twilio-{start.call_sid or start.stream_sid}",
                SessionSettings(tw.SAMPLE_RATE, "mulaw", prompt, output_audio=out),
                self.svc,
                self.on_event,
            )
        except p.ProtocolError as exc:  # e.g. a system_prompt over server.max_text_chars
            self.release_session()
            await self._refuse(CLOSE_POLICY, exc.message)
            return True
        log.info("twilio call %s stream %s started", start.call_sid, start.stream_sid)
        return False

    def _on_dtmf(self, digit: str) -> None:
        """Key presses join the conversation as a note the agent can read; no reply is forced."""
        self.dtmf.append(digit)
        if self.session is not None:
            self.session.add_user_text(f"(The caller pressed {digit} on the phone keypad.)")

    # ------------------------------------------------------------ session events -> Twilio

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
            # the caller talks over a reply that is still queued at Twilio or playing: the
            # session interrupts it, and Twilio drops what it has not played yet
            if self.svc.cfg.vad.barge_in:
                frames = play.speech_started(ev.turn_id)
        elif isinstance(ev, core.SessionError):
            self.svc.metrics.observe_error(ev.code)
            log.warning("twilio %s: %s: %s", self.stream_sid, ev.code, ev.message)
        for frame in frames:
            await self.send_frame(frame)
