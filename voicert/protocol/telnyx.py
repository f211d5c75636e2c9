"""Telnyx Media Streaming over WebSocket (bidirectional, RTP mode). Sans-I/O: JSON text in, typed
call events out, and the JSON for both directions (ours to Telnyx and, for the call simulator, what
Telnyx itself sends), written from Telnyx's published AsyncAPI description of the stream.

Telnyx -> us: ``connected``, ``start`` (``stream_id`` on the envelope; the call, its
``custom_parameters`` and ``media_format`` inside), ``media`` (a base64 RTP payload without its
header, on ``media.track`` ``inbound`` or ``outbound``), ``mark`` (our mark, once the audio before it
has played, or at once when none is queued; a ``clear`` returns the queued ones), ``dtmf``,
``error`` (``payload.code``, ``title``, ``detail``), ``stop``. Us -> Telnyx: ``media``
(``media.payload``), ``mark`` (``mark.name``), ``clear``.

Formats taken: PCMU and PCMA (G.711) at 8 kHz, mono; the reply is sent in the call's format. Other
codecs Telnyx can stream (G722, OPUS, AMR-WB, L16) are refused at the start, by name. Telnyx
numbers its frames with strings (``"sequence_number": "2"``).
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from typing import Any

from voicert.core import telephony as call
from voicert.protocol import carrier_json

# Telnyx's codec name -> the session's encoding; both at 8 kHz
FORMATS = {"PCMU": "mulaw", "PCMA": "alaw"}
SAMPLE_RATE = 8000
SILENCE = {"mulaw": b"\xff", "alaw": b"\xd5"}  # G.711's zero
FRAME_BYTES = 160  # 20 ms


class TelnyxError(call.CallMessageError):
    """A message that does not follow Telnyx's media-stream format."""


_F = carrier_json.Fields(TelnyxError, "Telnyx media-stream")


def _start(msg: dict[str, Any]) -> call.CallStart:
    start = _F.obj(msg, "start", "start")
    fmt = _F.obj(start, "media_format", "start")
    codec = _F.text(fmt, "encoding", "start.media_format")
    rate = _F.number(fmt.get("sample_rate", 8000), "start.media_format.sample_rate")
    channels = _F.number(fmt.get("channels", 1), "start.media_format.channels")
    known = FORMATS.get(codec.upper())
    refused = None
    if known is None or rate != SAMPLE_RATE or channels != 1:
        refused = (
            f"unsupported media format {codec} {rate} Hz x{channels} (expected PCMU or PCMA, "
            "8000 Hz, mono)"
        )
    return call.CallStart(
        call_id=str(start.get("call_control_id") or start.get("call_session_id") or ""),
        stream_id=str(msg.get("stream_id") or ""),
        encoding=known or "mulaw",
        sample_rate=rate,
        parameters=_F.strings(start.get("custom_parameters") or {}, "start.custom_parameters"),
        refused=refused,
    )


def _media(msg: dict[str, Any]) -> call.CallMedia:
    media = _F.obj(msg, "media", "media")
    return call.CallMedia(_F.audio(media, "media"), str(media.get("track", "inbound")) == "inbound")


def _error(msg: dict[str, Any]) -> call.CallNotice:
    payload = msg.get("payload")
    if not isinstance(payload, dict):
        return call.CallNotice("error (no detail)")
    code, title = payload.get("code", "?"), payload.get("title", "")
    detail = str(payload.get("detail", ""))[:200]
    return call.CallNotice(f"error {code}: {title} {detail}".strip())


def decode(frame: str | bytes) -> call.CallEvent | None:
    """One message from Telnyx -> a call event; None for an event type we do not handle.
    Raises TelnyxError for a malformed message."""
    msg = _F.message(frame)
    kind = msg["event"]
    if kind == "media":
        return _media(msg)
    if kind == "start":
        return _start(msg)
    if kind == "mark":
        return call.CallMark(_F.text(_F.obj(msg, "mark", "mark"), "name", "mark"))
    if kind == "dtmf":
        return call.CallDtmf(_F.text(_F.obj(msg, "dtmf", "dtmf"), "digit", "dtmf"))
    if kind == "stop":
        return call.CallStop()
    if kind == "error":
        return _error(msg)
    if kind == "connected":
        return call.CallNotice("connected")
    return None


# ---------------------------------------------------------------- us -> Telnyx


@dataclass(frozen=True, slots=True)
class Serializer:
    """Our messages to one Telnyx stream (``voicert.core.telephony.Serializer``): 20 ms media
    frames in the call's G.711 law."""

    encoding: str = "mulaw"
    frame_bytes: int = FRAME_BYTES

    @property
    def silence(self) -> bytes:
        return SILENCE[self.encoding]

    def media(self, payload: bytes) -> str:
        return carrier_json.dump(
            {"event": "media", "media": {"payload": base64.b64encode(payload).decode()}}
        )

    def mark(self, name: str) -> str:
        return carrier_json.dump({"event": "mark", "mark": {"name": name}})

    def clear(self) -> str:
        return carrier_json.dump({"event": "clear"})


class TelnyxProvider:
    """Telnyx media streams as the phone door reads them (``voicert.core.telephony.Provider``)."""

    name = "telnyx"

    def decode(self, frame: str | bytes) -> call.CallEvent | None:
        return decode(frame)

    def serializer(self, start: call.CallStart) -> Serializer:
        return Serializer(start.encoding)


PROVIDER = TelnyxProvider()


def decode_outbound(text: str) -> dict[str, Any]:
    """A message we sent, as Telnyx reads it (for the simulator): ``media`` payloads decoded.
    Raises TelnyxError for one Telnyx would not take."""
    try:
        msg = json.loads(text)
    except ValueError:
        raise TelnyxError("not valid JSON") from None
    kind = msg.get("event") if isinstance(msg, dict) else None
    if kind not in ("media", "mark", "clear"):
        raise TelnyxError(f"Telnyx does not take {kind!r} messages")
    if kind == "media":
        msg["media"]["payload"] = base64.b64decode(
            _F.text(_F.obj(msg, "media", "media"), "payload", "")
        )
    elif kind == "mark":
        _F.text(_F.obj(msg, "mark", "mark"), "name", "mark")
    return msg


# ---------------------------------------------------------------- Telnyx -> us (the simulator)


@dataclass(slots=True)
class InboundWriter:
    """Writes what Telnyx sends, in its published formats, with running sequence numbers."""

    stream_id: str
    call_control_id: str
    custom_parameters: dict[str, str] = field(default_factory=dict)
    _seq: int = 0
    _chunk: int = 0

    def _next(self) -> str:
        self._seq += 1
        return str(self._seq)

    def connected(self) -> str:
        return carrier_json.dump({"event": "connected", "version": "1.0.0"})

    def start(self, encoding: str = "PCMU", sample_rate: int = 8000) -> str:
        return carrier_json.dump(
            {
                "event": "start",
                "sequence_number": self._next(),
                "stream_id": self.stream_id,
                "start": {
                    "user_id": "00000000-0000-0000-0000-000000000000",
                    "call_control_id": self.call_control_id,
                    "call_session_id": "00000000-0000-0000-0000-000000000001",
                    "from": "+13125550100",
                    "to": "+13125550199",
                    "client_state": "",
                    "custom_parameters": self.custom_parameters,
                    "media_format": {
                        "encoding": encoding,
                        "sample_rate": sample_rate,
                        "channels": 1,
                    },
                },
            }
        )

    def media(self, payload: bytes, timestamp_ms: int) -> str:
        self._chunk += 1
        return carrier_json.dump(
            {
                "event": "media",
                "sequence_number": self._next(),
                "stream_id": self.stream_id,
                "media": {
                    "track": "inbound",
                    "chunk": str(self._chunk),
                    "timestamp": str(timestamp_ms),
                    "payload": base64.b64encode(payload).decode(),
                },
            }
        )

    def mark(self, name: str) -> str:
        return carrier_json.dump(
            {
                "event": "mark",
                "sequence_number": self._next(),
                "stream_id": self.stream_id,
                "mark": {"name": name},
            }
        )

    def dtmf(self, digit: str) -> str:
        return carrier_json.dump(
            {
                "event": "dtmf",
                "sequence_number": self._next(),
                "stream_id": self.stream_id,
                "dtmf": {"digit": digit},
            }
        )

    def stop(self) -> str:
        return carrier_json.dump(
            {
                "event": "stop",
                "sequence_number": self._next(),
                "stream_id": self.stream_id,
                "stop": {"call_control_id": self.call_control_id},
            }
        )
