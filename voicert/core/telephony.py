"""The words every telephony provider's media stream is read into, and the contract a provider
meets: one codec file in ``voicert/protocol/`` (Twilio, Telnyx, Plivo) plus one route line, under
the one phone door (``server/telephony.py``) and its sans-I/O playback (``transport/telephony.py``).

A provider's codec reads each message of its media-stream WebSocket into a :data:`CallEvent`, and
writes our messages to it through a :class:`Serializer` (its ``media``, ``mark`` and ``clear``). Both
directions are the provider's published formats; the carrier side (what the provider sends, and how
it reads ours) is in the same file, for the call simulator (``loadgen/phone.py``) and the tests.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, Union


class CallMessageError(ValueError):
    """A message that does not follow the provider's format (the call goes on: providers have no
    error channel back; the door logs and counts it)."""


@dataclass(frozen=True, slots=True)
class CallStart:
    """The stream is set up: who is calling, and the audio's format in the session's words
    (``encoding``: ``mulaw``, ``alaw`` or ``pcm16``). ``refused``: why the door cannot take the
    provider's format (the door closes with 1003 and this), else None."""

    call_id: str
    stream_id: str
    encoding: str
    sample_rate: int
    parameters: dict[str, str] = field(default_factory=dict)  # the call's custom parameters
    refused: str | None = None


@dataclass(frozen=True, slots=True)
class CallMedia:
    """Audio of the call; ``inbound``: the caller's track (the only one a session hears)."""

    payload: bytes
    inbound: bool = True


@dataclass(frozen=True, slots=True)
class CallMark:
    """The provider has played our audio up to the mark ``name`` (or dropped it on a clear)."""

    name: str


@dataclass(frozen=True, slots=True)
class CallDtmf:
    digit: str


@dataclass(frozen=True, slots=True)
class CallStop:
    """The provider ends the stream (the call hung up, or the stream was stopped)."""


@dataclass(frozen=True, slots=True)
class CallNotice:
    """A message that needs nothing of the door (``connected``, a clear's acknowledgement, a
    provider-side error report, which the door logs): ``what`` says which."""

    what: str


CallEvent = Union[CallStart, CallMedia, CallMark, CallDtmf, CallStop, CallNotice]


class Serializer(Protocol):
    """Our messages to one provider stream."""

    @property
    def frame_bytes(self) -> int:
        """Encoded audio per media message (160: 20 ms of 8 kHz mu-law)."""
        ...

    @property
    def silence(self) -> bytes:
        """One encoded sample of silence (pads the last frame)."""
        ...

    def media(self, payload: bytes) -> str: ...

    def mark(self, name: str) -> str: ...

    def clear(self) -> str: ...


class Provider(Protocol):
    """A telephony provider's media-stream codec (the carrier's side of the wire)."""

    name: str  # "twilio": its metrics and log label, and its session ids' prefix

    def decode(self, frame: str | bytes) -> CallEvent | None:
        """One message from the provider -> an event; None for an event type the door does not
        handle (providers add some). Raises CallMessageError for a malformed message."""
        ...

    def serializer(self, start: CallStart) -> Serializer:
        """Our messages to the stream ``start`` opened (its format)."""
        ...
