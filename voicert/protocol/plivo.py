"""Plivo Audio Streams (a bidirectional ``<Stream>``). Sans-I/O: JSON text in, typed call events out,
and the JSON for both directions (ours to Plivo and, for the call simulator, what Plivo itself
sends), written from Plivo's published audio-streaming reference.

Plivo -> us: ``start`` (``start.callId``, ``start.streamId``, ``start.mediaFormat``, and the
``<Stream extraHeaders>`` as one ``k=v;k=v`` string), ``media`` (base64 audio on ``media.track``),
``dtmf``, ``playedStream`` (our ``checkpoint`` reached: the audio before it has played),
``clearedAudio`` (our ``clearAudio`` done). A stream ends by its socket closing: Plivo sends no stop
event (one is read if it comes). Us -> Plivo: ``playAudio`` (``media.contentType``,
``media.sampleRate``, ``media.payload``), ``checkpoint`` (``streamId``, ``name``), ``clearAudio``.

Formats taken: ``audio/x-mulaw`` at 8 kHz (set ``contentType="audio/x-mulaw;rate=8000"`` on the
``<Stream>``; Plivo's default, ``audio/x-l16``, is refused at the start, by name). Plivo numbers its
messages with integers (``"sequenceNumber": 42``).
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from typing import Any

from voicert.core import telephony as call
from voicert.protocol import carrier_json

MULAW = "audio/x-mulaw"
SAMPLE_RATE = 8000
FRAME_BYTES = 160  # 20 ms of 8 kHz mu-law


class PlivoError(call.CallMessageError):
    """A message that does not follow Plivo's audio-stream format."""


_F = carrier_json.Fields(PlivoError, "Plivo audio-stream")


def extra_headers(value: Any) -> dict[str, str]:
    """``<Stream extraHeaders>`` as Plivo forwards it (``"a=1;b=2"``; ``,`` separates too) ->
    a dict. Raises PlivoError for a value that is not a string."""
    if value is None:
        return {}
    if not isinstance(value, str):
        raise PlivoError("extra_headers: must be a string")
    pairs = (part.partition("=") for part in value.replace(",", ";").split(";"))
    return {k.strip(): v.strip() for k, sep, v in pairs if sep and k.strip()}


def _start(msg: dict[str, Any]) -> call.CallStart:
    start = _F.obj(msg, "start", "start")
    fmt = _F.obj(start, "mediaFormat", "start")
    encoding = _F.text(fmt, "encoding", "start.mediaFormat")
    rate = _F.number(fmt.get("sampleRate", SAMPLE_RATE), "start.mediaFormat.sampleRate")
    refused = None
    if (encoding, rate) != (MULAW, SAMPLE_RATE):
        refused = (
            f'unsupported media format {encoding} {rate} Hz: set contentType="{MULAW};rate=8000"'
        )
    return call.CallStart(
        call_id=str(start.get("callId") or ""),
        stream_id=str(start.get("streamId") or msg.get("streamId") or ""),
        encoding="mulaw",
        sample_rate=SAMPLE_RATE,
        parameters=extra_headers(msg.get("extra_headers")),
        refused=refused,
    )


def _media(msg: dict[str, Any]) -> call.CallMedia:
    media = _F.obj(msg, "media", "media")
    return call.CallMedia(_F.audio(media, "media"), str(media.get("track", "inbound")) == "inbound")


def decode(frame: str | bytes) -> call.CallEvent | None:
    """One message from Plivo -> a call event; None for an event type we do not handle. Raises
    PlivoError for a malformed message."""
    msg = _F.message(frame)
    kind = msg["event"]
    if kind == "media":
        return _media(msg)
    if kind == "start":
        return _start(msg)
    if kind in ("playedStream", "played"):  # "played" in Plivo's FAQ; "playedStream" its reference
        return call.CallMark(_F.text(msg, "name", kind))
    if kind == "dtmf":
        return call.CallDtmf(_F.text(_F.obj(msg, "dtmf", "dtmf"), "digit", "dtmf"))
    if kind == "clearedAudio":
        return call.CallNotice("cleared")
    if kind == "stop":
        return call.CallStop()
    return None


# ---------------------------------------------------------------- us -> Plivo


@dataclass(frozen=True, slots=True)
class Serializer:
    """Our messages to one Plivo stream (``voicert.core.telephony.Serializer``)."""

    stream_id: str
    frame_bytes: int = FRAME_BYTES
    silence: bytes = b"\xff"  # mu-law zero

    def media(self, payload: bytes) -> str:
        media = {"contentType": MULAW, "sampleRate": SAMPLE_RATE}
        media["payload"] = base64.b64encode(payload).decode()
        return carrier_json.dump({"event": "playAudio", "media": media})

    def mark(self, name: str) -> str:
        return carrier_json.dump({"event": "checkpoint", "streamId": self.stream_id, "name": name})

    def clear(self) -> str:
        return carrier_json.dump({"event": "clearAudio", "streamId": self.stream_id})


class PlivoProvider:
    """Plivo audio streams as the phone door reads them (``voicert.core.telephony.Provider``)."""

    name = "plivo"

    def decode(self, frame: str | bytes) -> call.CallEvent | None:
        return decode(frame)

    def serializer(self, start: call.CallStart) -> Serializer:
        return Serializer(start.stream_id)


PROVIDER = PlivoProvider()


def decode_outbound(text: str) -> dict[str, Any]:
    """A message we sent, as Plivo reads it (for the simulator): ``playAudio`` payloads decoded.
    Raises PlivoError for one Plivo would not take."""
    try:
        msg = json.loads(text)
    except ValueError:
        raise PlivoError("not valid JSON") from None
    kind = msg.get("event") if isinstance(msg, dict) else None
    if kind == "playAudio":
        media = _F.obj(msg, "media", "playAudio")
        if (media.get("contentType"), media.get("sampleRate")) != (MULAW, SAMPLE_RATE):
            raise PlivoError(f"playAudio: not the stream's format: {media.get('contentType')}")
        media["payload"] = base64.b64decode(_F.text(media, "payload", "playAudio.media"))
    elif kind in ("checkpoint", "clearAudio"):
        _F.text(msg, "streamId", kind)
        if kind == "checkpoint":
            _F.text(msg, "name", kind)
    else:
        raise PlivoError(f"Plivo does not take {kind!r} messages")
    return msg


# ---------------------------------------------------------------- Plivo -> us (the simulator)


@dataclass(slots=True)
class InboundWriter:
    """Writes what Plivo sends, in its published formats, with running sequence numbers."""

    stream_id: str
    call_id: str
    headers: dict[str, str] = field(default_factory=dict)  # the <Stream extraHeaders>
    _seq: int = 0
    _chunk: int = 0

    def _next(self) -> int:
        self._seq += 1
        return self._seq

    def _extra(self) -> str:
        return ";".join(f"{k}={v}" for k, v in self.headers.items())

    def start(self, encoding: str = MULAW, sample_rate: int = SAMPLE_RATE) -> str:
        return carrier_json.dump(
            {
                "event": "start",
                "sequenceNumber": self._next(),
                "start": {
                    "callId": self.call_id,
                    "streamId": self.stream_id,
                    "accountId": "MA00000000000000000000",
                    "tracks": ["inbound"],
                    "mediaFormat": {"encoding": encoding, "sampleRate": sample_rate},
                },
                "extra_headers": self._extra(),
            }
        )

    def media(self, payload: bytes, timestamp_ms: int) -> str:
        self._chunk += 1
        return carrier_json.dump(
            {
                "event": "media",
                "sequenceNumber": self._next(),
                "streamId": self.stream_id,
                "media": {
                    "track": "inbound",
                    "timestamp": str(timestamp_ms),
                    "chunk": self._chunk,
                    "payload": base64.b64encode(payload).decode(),
                },
                "extra_headers": self._extra(),
            }
        )

    def played(self, name: str) -> str:
        return carrier_json.dump(
            {
                "event": "playedStream",
                "sequenceNumber": self._next(),
                "streamId": self.stream_id,
                "name": name,
            }
        )

    def cleared(self) -> str:
        return carrier_json.dump(
            {"event": "clearedAudio", "sequenceNumber": self._next(), "streamId": self.stream_id}
        )

    def dtmf(self, digit: str) -> str:
        return carrier_json.dump(
            {
                "event": "dtmf",
                "sequenceNumber": self._next(),
                "streamId": self.stream_id,
                "dtmf": {"track": "inbound", "digit": digit, "timestamp": "0"},
            }
        )
