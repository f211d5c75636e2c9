"""Twilio Media Streams messages (bidirectional ``<Connect><Stream>``). Sans-I/O: JSON text in, typed
events out, and the JSON for both directions (the server's replies and, for the call simulator,
what Twilio itself sends). No sockets, no asyncio.

Twilio -> us: ``connected``, ``start``, ``media`` (base64 mu-law, 8 kHz, mono), ``mark`` (echoed when
our audio before it has played), ``dtmf``, ``stop``. Us -> Twilio: ``media``, ``mark``, ``clear``.

:data:`PROVIDER` is this file as the phone door takes it (``voicert.core.telephony.Provider``).
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from typing import Any, Union

from voicert.core import telephony as call
from voicert.protocol import carrier_json

MULAW = "audio/x-mulaw"
SAMPLE_RATE = 8000
FRAME_BYTES = 160  # 20 ms of 8 kHz mu-law: the frame size Twilio sends and expects


class TwilioError(call.CallMessageError):
    """A message that does not follow the Media Streams format."""


@dataclass(slots=True)
class Connected:
    protocol: str
    version: str


@dataclass(slots=True)
class Start:
    stream_sid: str
    call_sid: str
    account_sid: str
    tracks: list[str]
    custom_parameters: dict[str, str]
    encoding: str
    sample_rate: int
    channels: int


@dataclass(slots=True)
class Media:
    track: str
    chunk: int
    timestamp_ms: int
    payload: bytes


@dataclass(slots=True)
class Mark:
    name: str


@dataclass(slots=True)
class Dtmf:
    digit: str


@dataclass(slots=True)
class Stop:
    call_sid: str


InboundEvent = Union[Connected, Start, Media, Mark, Dtmf, Stop]


_F = carrier_json.Fields(TwilioError, "Media Streams")


def _strings(value: Any, where: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise TwilioError(f"{where}: must be a list of strings")
    return list(value)


def decode_inbound(text: str | bytes) -> InboundEvent | None:
    """One message from Twilio -> an event; None for an event type we do not handle (Twilio may
    add some). Raises TwilioError for malformed messages."""
    msg = _F.message(text)
    kind = msg["event"]
    if kind == "connected":
        return Connected(str(msg.get("protocol", "")), str(msg.get("version", "")))
    if kind == "start":
        start = _F.obj(msg, "start", "start")
        fmt = _F.obj(start, "mediaFormat", "start")
        return Start(
            stream_sid=str(msg.get("streamSid") or start.get("streamSid") or ""),
            call_sid=str(start.get("callSid", "")),
            account_sid=str(start.get("accountSid", "")),
            tracks=_strings(start.get("tracks") or ["inbound"], "start.tracks"),
            custom_parameters=_F.strings(
                start.get("customParameters") or {}, "start.customParameters"
            ),
            encoding=_F.text(fmt, "encoding", "start.mediaFormat"),
            sample_rate=_F.number(fmt.get("sampleRate"), "start.mediaFormat.sampleRate"),
            channels=_F.number(fmt.get("channels", 1), "start.mediaFormat.channels"),
        )
    if kind == "media":
        media = _F.obj(msg, "media", "media")
        payload = _F.audio(media, "media")
        return Media(
            track=str(media.get("track", "inbound")),
            chunk=_F.number(media.get("chunk", 0), "media.chunk"),
            timestamp_ms=_F.number(media.get("timestamp", 0), "media.timestamp"),
            payload=payload,
        )
    if kind == "mark":
        return Mark(_F.text(_F.obj(msg, "mark", "mark"), "name", "mark"))
    if kind == "dtmf":
        return Dtmf(_F.text(_F.obj(msg, "dtmf", "dtmf"), "digit", "dtmf"))
    if kind == "stop":
        stop = msg.get("stop") or {}
        if not isinstance(stop, dict):
            raise TwilioError("stop: must be an object")
        return Stop(str(stop.get("callSid", "")))
    return None


# ---------------------------------------------------------------- us -> Twilio


def media_message(stream_sid: str, payload: bytes) -> str:
    return carrier_json.dump(
        {
            "event": "media",
            "streamSid": stream_sid,
            "media": {"payload": base64.b64encode(payload).decode("ascii")},
        }
    )


def mark_message(stream_sid: str, name: str) -> str:
    return carrier_json.dump({"event": "mark", "streamSid": stream_sid, "mark": {"name": name}})


def clear_message(stream_sid: str) -> str:
    return carrier_json.dump({"event": "clear", "streamSid": stream_sid})


@dataclass(frozen=True, slots=True)
class Serializer:
    """Our messages to one Twilio stream (voicert.transport.telephony.Serializer)."""

    stream_sid: str
    frame_bytes: int = FRAME_BYTES
    silence: bytes = b"\xff"  # mu-law zero

    def media(self, payload: bytes) -> str:
        return media_message(self.stream_sid, payload)

    def mark(self, name: str) -> str:
        return mark_message(self.stream_sid, name)

    def clear(self) -> str:
        return clear_message(self.stream_sid)


def decode_outbound(text: str) -> dict[str, Any]:
    """A message we sent, as Twilio reads it (for the simulator). Raises TwilioError."""
    try:
        msg = json.loads(text)
    except ValueError:
        raise TwilioError("not valid JSON") from None
    kind = _F.text(msg, "event", "message")
    if kind not in ("media", "mark", "clear"):
        raise TwilioError(f"Twilio does not accept '{kind}' messages")
    _F.text(msg, "streamSid", kind)
    if kind == "media":
        msg["media"]["payload"] = base64.b64decode(_F.text(msg["media"], "payload", "media"))
    return msg


# ---------------------------------------------------------------- Twilio -> us (the simulator)


@dataclass(slots=True)
class InboundWriter:
    """Writes what Twilio sends, in its published formats, with running sequence numbers."""

    stream_sid: str
    call_sid: str
    account_sid: str = "AC00000000000000000000000000000000"
    _seq: int = 0
    _chunk: int = 0
    custom_parameters: dict[str, str] = field(default_factory=dict)

    def _next(self) -> str:
        self._seq += 1
        return str(self._seq)

    def connected(self) -> str:
        return carrier_json.dump({"event": "connected", "protocol": "Call", "version": "1.0.0"})

    def start(self, encoding: str = MULAW, sample_rate: int = SAMPLE_RATE) -> str:
        return carrier_json.dump(
            {
                "event": "start",
                "sequenceNumber": self._next(),
                "streamSid": self.stream_sid,
                "start": {
                    "streamSid": self.stream_sid,
                    "accountSid": self.account_sid,
                    "callSid": self.call_sid,
                    "tracks": ["inbound"],
                    "customParameters": self.custom_parameters,
                    "mediaFormat": {"encoding": encoding, "sampleRate": sample_rate, "channels": 1},
                },
            }
        )

    def media(self, payload: bytes, timestamp_ms: int) -> str:
        self._chunk += 1
        return carrier_json.dump(
            {
                "event": "media",
                "sequenceNumber": self._next(),
                "streamSid": self.stream_sid,
                "media": {
                    "track": "inbound",
                    "chunk": str(self._chunk),
                    "timestamp": str(timestamp_ms),
                    "payload": base64.b64encode(payload).decode("ascii"),
                },
            }
        )

    def mark(self, name: str) -> str:
        return carrier_json.dump(
            {
                "event": "mark",
                "sequenceNumber": self._next(),
                "streamSid": self.stream_sid,
                "mark": {"name": name},
            }
        )

    def dtmf(self, digit: str) -> str:
        return carrier_json.dump(
            {
                "event": "dtmf",
                "sequenceNumber": self._next(),
                "streamSid": self.stream_sid,
                "dtmf": {"track": "inbound_track", "digit": digit},
            }
        )

    def stop(self) -> str:
        return carrier_json.dump(
            {
                "event": "stop",
                "sequenceNumber": self._next(),
                "streamSid": self.stream_sid,
                "stop": {"accountSid": self.account_sid, "callSid": self.call_sid},
            }
        )


# ---------------------------------------------------------------- the phone door's view


class TwilioProvider:
    """Media Streams as the phone door reads it (``voicert.core.telephony.Provider``)."""

    name = "twilio"

    def decode(self, frame: str | bytes) -> call.CallEvent | None:
        event = decode_inbound(frame)
        if isinstance(event, Media):
            return call.CallMedia(event.payload, event.track in ("inbound", "inbound_track"))
        if isinstance(event, Start):
            return _start(event)
        if isinstance(event, Mark):
            return call.CallMark(event.name)
        if isinstance(event, Dtmf):
            return call.CallDtmf(event.digit)
        if isinstance(event, Stop):
            return call.CallStop()
        if isinstance(event, Connected):
            return call.CallNotice("connected")
        return None

    def serializer(self, start: call.CallStart) -> Serializer:
        return Serializer(start.stream_id)


def _start(start: Start) -> call.CallStart:
    fmt = (start.encoding, start.sample_rate, start.channels)
    refused = None
    if fmt != (MULAW, SAMPLE_RATE, 1):
        refused = (
            f"unsupported media format {start.encoding} {start.sample_rate} Hz "
            f"x{start.channels} (expected {MULAW} 8000 Hz mono)"
        )
    return call.CallStart(
        start.call_sid or start.stream_sid,
        start.stream_sid,
        "mulaw",
        SAMPLE_RATE,
        start.custom_parameters,
        refused,
    )


PROVIDER = TwilioProvider()
