"""Typed reads of a carrier's media-stream JSON (Twilio, Telnyx, Plivo), shared by their codecs.

Each codec makes one :class:`Fields` with its own error class; every read either returns the
value in the type asked for or raises that error naming where the message went wrong."""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from voicert.core.telephony import CallMessageError
from voicert.protocol import jsontext


def dump(msg: dict[str, Any]) -> str:
    """A message as compact JSON text, the way carriers send theirs."""
    return json.dumps(msg, separators=(",", ":"))


class Fields:
    """Reads of one carrier's messages, raising ``error`` (a CallMessageError) on a bad one."""

    __slots__ = ("carrier", "error")

    def __init__(self, error: type[CallMessageError], carrier: str) -> None:
        self.error = error
        self.carrier = carrier

    def message(self, frame: str | bytes) -> dict[str, Any]:
        """One text frame -> its JSON object, with a string ``event``."""
        if isinstance(frame, bytes):
            raise self.error(f"binary frame: {self.carrier} messages are JSON text")
        try:
            msg = jsontext.loads(frame)
        except jsontext.BadValue as exc:
            raise self.error(f"message: {exc}") from None
        except (ValueError, RecursionError):  # RecursionError: deeper than the parser goes
            raise self.error("not valid JSON") from None
        if not isinstance(msg, dict) or not isinstance(msg.get("event"), str):
            raise self.error("message: missing or bad 'event'")
        return msg

    def obj(self, d: Any, key: str, where: str) -> dict[str, Any]:
        value = d.get(key) if isinstance(d, dict) else None
        if not isinstance(value, dict):
            raise self.error(f"{where}: missing or bad '{key}'")
        return value

    def text(self, d: Any, key: str, where: str) -> str:
        value = d.get(key) if isinstance(d, dict) else None
        if not isinstance(value, str):
            raise self.error(f"{where}: missing or bad '{key}'")
        return value

    def number(self, value: Any, where: str) -> int:
        """A number, sent as one or as a string (Twilio sends ``"sequenceNumber": "2"``)."""
        try:
            return int(value)
        except (TypeError, ValueError, OverflowError):  # (OverflowError: an infinite float)
            raise self.error(f"{where}: not a number") from None

    def strings(self, value: Any, where: str) -> dict[str, str]:
        """An object of strings (custom parameters): only strings pass."""
        if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
            raise self.error(f"{where}: must be an object of strings")
        return dict(value)

    def audio(self, d: Any, where: str) -> bytes:
        """``d["payload"]``: base64 audio, strictly decoded."""
        try:
            return base64.b64decode(self.text(d, "payload", where), validate=True)
        except (binascii.Error, ValueError):
            raise self.error(f"{where}.payload is not valid base64") from None
