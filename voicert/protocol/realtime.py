"""A compatible subset of the OpenAI Realtime API (``/v1/realtime``). Sans-I/O: JSON text in, typed
client events out (msgspec structs), typed server events (``realtime_events.py``) encoded. No
sockets, no asyncio.

Two flavours of event names are spoken: the GA API's (``response.output_text.delta``,
``conversation.item.added``...) and the beta API's (``response.text.delta``,
``conversation.item.created``...), chosen per connection (beta when the client sends
``OpenAI-Beta: realtime=v1``). Session fields are read in either shape (``audio.input.format`` or
``input_audio_format``) and written back in the connection's shape. See ``docs/protocol.md``.
"""

from __future__ import annotations

import base64
import binascii
import enum
import itertools
import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Union

import msgspec

from voicert.core.chat import AUTO, ToolChoice, ToolSpec
from voicert.protocol import jsontext
from voicert.protocol import realtime_events as events
from voicert.protocol.tools import (
    WireError,
    choice_from_wire,
    choice_to_wire,
    tool_to_wire,
    tools_from_wire,
)

INVALID_REQUEST = "invalid_request_error"
SERVER_ERROR = "server_error"

# wire audio format names -> (voicert encoding, sample rate)
BETA_FORMATS = {
    "pcm16": ("pcm16", 24000),
    "g711_ulaw": ("mulaw", 8000),
    "g711_alaw": ("alaw", 8000),
}
GA_FORMATS = {
    "audio/pcm": ("pcm16", 24000),
    "audio/pcmu": ("mulaw", 8000),
    "audio/pcma": ("alaw", 8000),
}


class Flavor(enum.Enum):
    GA = "ga"
    BETA = "beta"


# server event names that differ between the flavours: GA name -> beta name
_BETA_NAMES = {
    "response.output_text.delta": "response.text.delta",
    "response.output_text.done": "response.text.done",
    "response.output_audio.delta": "response.audio.delta",
    "response.output_audio.done": "response.audio.done",
    "response.output_audio_transcript.delta": "response.audio_transcript.delta",
    "response.output_audio_transcript.done": "response.audio_transcript.done",
    "conversation.item.added": "conversation.item.created",
}


class RealtimeError(Exception):
    """A client mistake, answered with an ``error`` event; the socket stays open."""

    def __init__(
        self,
        code: str,
        message: str,
        param: str | None = None,
        event_id: str | None = None,
        kind: str = INVALID_REQUEST,
    ) -> None:
        super().__init__(message)
        self.code, self.message, self.param, self.event_id, self.kind = (
            code,
            message,
            param,
            event_id,
            kind,
        )


# ---------------------------------------------------------------- session configuration


EAGERNESS = ("low", "medium", "high", "auto")


@dataclass(frozen=True, slots=True)
class TurnDetection:
    """``server_vad`` (silence) or ``semantic_vad`` (judged at a pause: ``eagerness``) turn
    detection; ``None`` in :class:`SessionConfig` means manual commits."""

    type: str = "server_vad"
    threshold: float = 0.5
    prefix_padding_ms: int = 300
    silence_duration_ms: int = 500
    create_response: bool = True
    interrupt_response: bool = True
    eagerness: str = "auto"  # semantic_vad: low waits longer for the speaker, high cuts in sooner

    def to_wire(self) -> dict[str, Any]:
        if self.type == "semantic_vad":
            return {
                "type": "semantic_vad",
                "eagerness": self.eagerness,
                "create_response": self.create_response,
                "interrupt_response": self.interrupt_response,
            }
        return {
            "type": "server_vad",
            "threshold": self.threshold,
            "prefix_padding_ms": self.prefix_padding_ms,
            "silence_duration_ms": self.silence_duration_ms,
            "create_response": self.create_response,
            "interrupt_response": self.interrupt_response,
        }


@dataclass(frozen=True, slots=True)
class SessionConfig:
    instructions: str
    input_format: str = "pcm16"  # beta name; see BETA_FORMATS
    output_format: str = "pcm16"
    audio_out: bool = True  # output modalities include audio (else text only)
    turn_detection: TurnDetection | None = field(default_factory=TurnDetection)
    transcription: bool = True  # send input audio transcription events
    max_output_tokens: int | None = None
    voice: str = ""  # one of the server's voice ids ("": no speech output)
    tools: tuple[ToolSpec, ...] = ()  # functions the client runs
    tool_choice: ToolChoice = AUTO
    temperature: float | None = None  # sampled replies at this temperature; None: greedy

    def to_wire(self, flavor: Flavor, session_id: str, model: str) -> dict[str, Any]:
        td = None if self.turn_detection is None else self.turn_detection.to_wire()
        max_tokens = self.max_output_tokens if self.max_output_tokens is not None else "inf"
        transcription = {"model": "whisper-1"} if self.transcription else None
        if flavor is Flavor.BETA:
            return {
                "id": session_id,
                "object": "realtime.session",
                "model": model,
                "modalities": ["text", "audio"] if self.audio_out else ["text"],
                "instructions": self.instructions,
                "voice": self.voice,
                "input_audio_format": self.input_format,
                "output_audio_format": self.output_format,
                "input_audio_transcription": transcription,
                "turn_detection": td,
                "tools": [tool_to_wire(t) for t in self.tools],
                "tool_choice": choice_to_wire(self.tool_choice),
                "temperature": 0.8 if self.temperature is None else self.temperature,
                "max_response_output_tokens": max_tokens,
            }
        return {
            "type": "realtime",
            "id": session_id,
            "object": "realtime.session",
            "model": model,
            "output_modalities": ["audio"] if self.audio_out else ["text"],
            "instructions": self.instructions,
            "audio": {
                "input": {
                    "format": _ga_format(self.input_format),
                    "transcription": transcription,
                    "turn_detection": td,
                },
                "output": {"format": _ga_format(self.output_format), "voice": self.voice},
            },
            "tools": [tool_to_wire(t) for t in self.tools],
            "tool_choice": choice_to_wire(self.tool_choice),
            "max_output_tokens": max_tokens,
        }


def _ga_format(beta_name: str) -> dict[str, Any]:
    encoding, rate = BETA_FORMATS[beta_name]
    ga = next(k for k, v in GA_FORMATS.items() if v == (encoding, rate))
    return {"type": ga, "rate": rate} if ga == "audio/pcm" else {"type": ga}


def _format(value: Any, param: str) -> str:
    """A wire audio format in either flavour -> its beta name."""
    if isinstance(value, str) and value in BETA_FORMATS:
        return value
    if (
        isinstance(value, dict)
        and isinstance(value.get("type"), str)
        and value["type"] in GA_FORMATS
    ):
        encoding, rate = GA_FORMATS[value["type"]]
        if value.get("rate", rate) != rate:
            raise RealtimeError("invalid_value", f"{param}.rate must be {rate}", f"{param}.rate")
        return next(k for k, v in BETA_FORMATS.items() if v == (encoding, rate))
    supported = ", ".join([*BETA_FORMATS, *GA_FORMATS])
    raise RealtimeError(
        "invalid_value", f"Invalid audio format {value!r:.60}; supported: {supported}", param
    )


def _number(value: Any, param: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RealtimeError("invalid_type", f"{param} must be a number", param)
    return float(value)


def _whole(value: Any, param: str) -> int:
    """An integer field; a float with no fraction (``300.0``) is taken, as JSON does not tell."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise RealtimeError("invalid_type", f"{param} must be an integer", param)
    return value


def _flag(value: Any, param: str) -> bool:
    if not isinstance(value, bool):
        raise RealtimeError("invalid_type", f"{param} must be a boolean", param)
    return value


def _turn_detection(value: Any, current: TurnDetection | None, param: str) -> TurnDetection | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise RealtimeError("invalid_type", f"{param} must be an object or null", param)
    kind = value.get("type", "server_vad")
    if kind not in ("server_vad", "semantic_vad"):
        raise RealtimeError(
            "invalid_value",
            f"{param}.type {kind!r:.40} is not supported "
            "(supported: server_vad, semantic_vad, or null for manual commits)",
            f"{param}.type",
        )
    td = current if current is not None and current.type == kind else TurnDetection(type=kind)
    fields: dict[str, Any] = {}
    keys = (
        (("eagerness", _eagerness),)
        if kind == "semantic_vad"
        else (
            ("threshold", _number),
            ("prefix_padding_ms", _whole),
            ("silence_duration_ms", _whole),
        )
    )
    allowed = {"type", "create_response", "interrupt_response", *(k for k, _ in keys)}
    for key in value:
        if key not in allowed and value[key] is not None:
            raise RealtimeError(
                "invalid_value",
                f"{param}.{key:.40} is not supported with "
                f"type {kind} (supported: {', '.join(sorted(allowed))})",
                f"{param}.{key:.40}",
            )
    for key, parse in (*keys, ("create_response", _flag), ("interrupt_response", _flag)):
        if value.get(key) is not None:
            fields[key] = parse(value[key], f"{param}.{key}")
    td = replace(td, **fields)
    if not (
        0 < td.threshold < 1
        and 0 <= td.prefix_padding_ms <= 2000
        and 32 <= td.silence_duration_ms <= 10000
    ):
        raise RealtimeError(
            "invalid_value",
            f"{param}: threshold in (0, 1), prefix_padding_ms in "
            "[0, 2000], silence_duration_ms in [32, 10000]",
            param,
        )
    return td


def _eagerness(value: Any, param: str) -> str:
    if value not in EAGERNESS:
        raise RealtimeError(
            "invalid_value", f"{param} must be one of {', '.join(EAGERNESS)}", param
        )
    return value


def _max_tokens(value: Any, param: str) -> int | None:
    if value == "inf" or value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 4096:
        return value
    raise RealtimeError("invalid_value", f"{param} must be 1-4096 or 'inf'", param)


def _audio_out(modalities: Any, param: str) -> bool:
    if (
        not isinstance(modalities, list)
        or not modalities
        or not all(m in ("text", "audio") for m in modalities if isinstance(m, str))
        or not all(isinstance(m, str) for m in modalities)
    ):
        raise RealtimeError("invalid_value", f"{param} must be a list of 'text' / 'audio'", param)
    return "audio" in modalities


# session fields of either flavour: those that change what voicert does are applied; the rest
# are accepted only at values that ask for nothing voicert would not do (see _check_inert)
_SESSION_KEYS = {
    "type",
    "model",
    "id",
    "object",
    "instructions",
    "modalities",
    "output_modalities",
    "input_audio_format",
    "output_audio_format",
    "turn_detection",
    "input_audio_transcription",
    "max_response_output_tokens",
    "max_output_tokens",
    "voice",
    "audio",
    "tools",
    "tool_choice",
    "temperature",
    "tracing",
    "truncation",
    "speed",
    "include",
    "prompt",
    "input_audio_noise_reduction",
    "expires_at",
    "client_secret",
}
_AUDIO_INPUT_KEYS = {"format", "transcription", "turn_detection", "noise_reduction"}
_AUDIO_OUTPUT_KEYS = {"format", "voice", "speed"}


def _unknown(keys: set[str], known: set[str], where: str) -> None:
    extra = sorted(k for k in keys if k not in known)
    if extra:
        raise RealtimeError(
            "unknown_parameter", f"Unknown parameter: '{where}.{extra[0]}'.", f"{where}.{extra[0]}"
        )


def _unsupported(param: str, what: str) -> RealtimeError:
    return RealtimeError(
        "unsupported_value", f"{param}: {what} is not supported by this server", param
    )


def _check_inert(s: dict[str, Any]) -> None:
    """Refuse what voicert would not do (noise reduction, a stored prompt, other speeds) rather
    than accept it and do something else."""
    for key in ("prompt", "input_audio_noise_reduction"):
        if s.get(key) is not None:
            raise _unsupported(f"session.{key}", key.replace("_", " "))
    if s.get("include"):
        raise _unsupported("session.include", "include")
    if s.get("speed") not in (None, 1, 1.0):
        raise _unsupported("session.speed", "a speed other than 1.0")


def _temperature(value: Any, param: str) -> float:
    """A sampling temperature: a number in [0, 2] (0: greedy)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 2:
        raise RealtimeError("invalid_value", f"{param} must be a number in [0, 2]", param)
    return float(value)


def update_session(cfg: SessionConfig, s: dict[str, Any]) -> SessionConfig:
    """Apply a ``session.update``'s ``session`` map (either flavour) to ``cfg``. Unknown fields,
    and known ones asking for what this server does not do, are refused (nothing is applied)."""
    _unknown(set(s), _SESSION_KEYS, "session")
    _check_inert(s)
    changes: dict[str, Any] = {}
    if "instructions" in s:
        if not isinstance(s["instructions"], str):
            raise RealtimeError(
                "invalid_type", "session.instructions must be a string", "session.instructions"
            )
        changes["instructions"] = s["instructions"]
    for key in ("modalities", "output_modalities"):
        if key in s:
            changes["audio_out"] = _audio_out(s[key], f"session.{key}")
    if "input_audio_format" in s:
        changes["input_format"] = _format(s["input_audio_format"], "session.input_audio_format")
    if "output_audio_format" in s:
        changes["output_format"] = _format(s["output_audio_format"], "session.output_audio_format")
    if "turn_detection" in s:
        changes["turn_detection"] = _turn_detection(
            s["turn_detection"], cfg.turn_detection, "session.turn_detection"
        )
    if "input_audio_transcription" in s:
        changes["transcription"] = s["input_audio_transcription"] is not None
    for key in ("max_response_output_tokens", "max_output_tokens"):
        if key in s:
            changes["max_output_tokens"] = _max_tokens(s[key], f"session.{key}")
    if "voice" in s:
        changes["voice"] = _voice(s["voice"], "session.voice")
    if s.get("temperature") is not None:
        changes["temperature"] = _temperature(s["temperature"], "session.temperature")
    try:
        if s.get("tools") is not None:
            changes["tools"] = tools_from_wire(s["tools"], "session.tools")
        if s.get("tool_choice") is not None:
            changes["tool_choice"] = choice_from_wire(s["tool_choice"], "session.tool_choice")
    except WireError as exc:
        raise RealtimeError("invalid_value", str(exc), exc.param) from None
    audio = s.get("audio")
    if audio is not None:
        if not isinstance(audio, dict):
            raise RealtimeError("invalid_type", "session.audio must be an object", "session.audio")
        inp, out = audio.get("input") or {}, audio.get("output") or {}
        _unknown(set(audio), {"input", "output"}, "session.audio")
        for name, part, known in (
            ("input", inp, _AUDIO_INPUT_KEYS),
            ("output", out, _AUDIO_OUTPUT_KEYS),
        ):
            if not isinstance(part, dict):
                raise RealtimeError(
                    "invalid_type",
                    f"session.audio.{name} must be an object",
                    f"session.audio.{name}",
                )
            _unknown(set(part), known, f"session.audio.{name}")
        if inp.get("noise_reduction") is not None:
            raise _unsupported("session.audio.input.noise_reduction", "noise reduction")
        if out.get("speed") not in (None, 1, 1.0):
            raise _unsupported("session.audio.output.speed", "a speed other than 1.0")
        if "format" in inp:
            changes["input_format"] = _format(inp["format"], "session.audio.input.format")
        if "format" in out:
            changes["output_format"] = _format(out["format"], "session.audio.output.format")
        if "turn_detection" in inp:
            changes["turn_detection"] = _turn_detection(
                inp["turn_detection"], cfg.turn_detection, "session.audio.input.turn_detection"
            )
        if "transcription" in inp:
            changes["transcription"] = inp["transcription"] is not None
        if "voice" in out:
            changes["voice"] = _voice(out["voice"], "session.audio.output.voice")
    return replace(cfg, **changes)


def _voice(value: Any, param: str) -> str:
    if not isinstance(value, str) or not value:
        raise RealtimeError("invalid_type", f"{param} must be a non-empty string", param)
    return value


# ---------------------------------------------------------------- client events (typed structs)


class SessionUpdate(msgspec.Struct):
    session: dict[str, Any]


class AudioAppend(msgspec.Struct):
    audio: bytes


class AudioCommit(msgspec.Struct):
    pass


class AudioClear(msgspec.Struct):
    pass


class ItemCreate(msgspec.Struct):
    item_id: str | None
    role: str  # user | assistant | system (a message); assistant (function_call); tool (output)
    text: str  # a message's text, a function_call's arguments, a function_call_output's output
    kind: str = "message"  # message | function_call | function_call_output
    call_id: str = ""
    name: str = ""  # function_call: the tool


class ResponseCreate(msgspec.Struct):
    instructions: str | None = None
    max_output_tokens: int | None = None
    audio_out: bool | None = None  # None: the session's modalities
    tool_choice: ToolChoice | None = None  # None: the session's
    tools: tuple[ToolSpec, ...] | None = None  # this response's client tools (None: the session's)


class ResponseCancel(msgspec.Struct):
    pass


class ItemTruncate(msgspec.Struct):
    item_id: str
    content_index: int
    audio_end_ms: int


class ItemDelete(msgspec.Struct):
    item_id: str


class ItemRetrieve(msgspec.Struct):
    item_id: str


ClientEvent = Union[
    SessionUpdate,
    AudioAppend,
    AudioCommit,
    AudioClear,
    ItemCreate,
    ResponseCreate,
    ResponseCancel,
    ItemTruncate,
    ItemDelete,
    ItemRetrieve,
]

# Known API events this server does not implement: answered with an error naming them.
UNSUPPORTED = ("output_audio_buffer.clear", "transcription_session.update")


def _item_id(msg: dict) -> str:
    item_id = msg.get("item_id")
    if not isinstance(item_id, str) or not item_id:
        raise RealtimeError(
            "missing_required_parameter", "Missing required parameter: 'item_id'.", "item_id"
        )
    return item_id


def _item_truncate(msg: dict) -> ItemTruncate:
    item_id = _item_id(msg)
    for key in ("content_index", "audio_end_ms"):
        if key not in msg:
            raise RealtimeError(
                "missing_required_parameter", f"Missing required parameter: '{key}'.", key
            )
    index, end = (
        _whole(msg["content_index"], "content_index"),
        _whole(msg["audio_end_ms"], "audio_end_ms"),
    )
    if index < 0 or end < 0:
        raise RealtimeError(
            "invalid_value",
            "content_index and audio_end_ms must be >= 0",
            "audio_end_ms" if end < 0 else "content_index",
        )
    return ItemTruncate(item_id, index, end)


def _item_create(msg: dict) -> ItemCreate:
    item = msg.get("item")
    if not isinstance(item, dict):
        raise RealtimeError(
            "missing_required_parameter", "Missing required parameter: 'item'.", "item"
        )
    kind = item.get("type", "message")
    if kind in ("function_call", "function_call_output"):
        return _call_item(item, kind)
    if kind != "message":
        raise RealtimeError(
            "invalid_value",
            f"item.type {kind!r:.40} is not supported (supported: "
            "message, function_call, function_call_output)",
            "item.type",
        )
    role = item.get("role")
    if role not in ("user", "assistant", "system"):
        raise RealtimeError(
            "invalid_value", "item.role must be user, assistant or system", "item.role"
        )
    content = item.get("content")
    if not isinstance(content, list) or not content:
        raise RealtimeError(
            "missing_required_parameter", "item.content must be a non-empty list", "item.content"
        )
    texts = []
    for i, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") not in (
            "input_text",
            "text",
            "output_text",
        ):
            raise RealtimeError(
                "invalid_value",
                f"item.content[{i}].type must be input_text or "
                "text (audio content is sent with input_audio_buffer.append)",
                f"item.content[{i}].type",
            )
        if not isinstance(part.get("text"), str):
            raise RealtimeError(
                "invalid_type",
                f"item.content[{i}].text must be a string",
                f"item.content[{i}].text",
            )
        texts.append(part["text"])
    item_id = item.get("id")
    return ItemCreate(item_id if isinstance(item_id, str) else None, role, "".join(texts))


def _call_item(item: dict, kind: str) -> ItemCreate:
    """A function_call (the client records a call) or function_call_output (a call's result)."""
    call_id = item.get("call_id")
    if not isinstance(call_id, str) or not call_id:
        raise RealtimeError(
            "missing_required_parameter",
            "Missing required parameter: 'item.call_id'.",
            "item.call_id",
        )
    item_id = item.get("id") if isinstance(item.get("id"), str) else None
    if kind == "function_call_output":
        output = item.get("output")
        if not isinstance(output, str):
            raise RealtimeError("invalid_type", "item.output must be a string", "item.output")
        return ItemCreate(item_id, "tool", output, kind, call_id)
    name, arguments = item.get("name"), item.get("arguments", "{}")
    if not isinstance(name, str) or not name:
        raise RealtimeError(
            "missing_required_parameter", "Missing required parameter: 'item.name'.", "item.name"
        )
    try:
        if not isinstance(arguments, str) or not isinstance(jsontext.loads(arguments), dict):
            raise ValueError
    except ValueError:  # (BadValue too: numbers and nesting past the bounds)
        raise RealtimeError(
            "invalid_value", "item.arguments must be JSON text of an object", "item.arguments"
        ) from None
    return ItemCreate(item_id, "assistant", arguments, kind, call_id, name)


def _response_create(msg: dict) -> ResponseCreate:
    r = msg.get("response") or {}
    if not isinstance(r, dict):
        raise RealtimeError("invalid_type", "response must be an object", "response")
    instructions = r.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise RealtimeError(
            "invalid_type", "response.instructions must be a string", "response.instructions"
        )
    max_tokens = None
    for key in ("max_output_tokens", "max_response_output_tokens"):
        if key in r:
            max_tokens = _max_tokens(r[key], f"response.{key}")
    audio_out = None
    for key in ("modalities", "output_modalities"):
        if key in r:
            audio_out = _audio_out(r[key], f"response.{key}")
    choice = tools = None
    try:
        if r.get("tools") is not None:  # this response's tools, in place of the session's
            tools = tools_from_wire(r["tools"], "response.tools")
        if r.get("tool_choice") is not None:
            choice = choice_from_wire(r["tool_choice"], "response.tool_choice")
    except WireError as exc:
        raise RealtimeError("invalid_value", str(exc), exc.param) from None
    return ResponseCreate(instructions, max_tokens, audio_out, choice, tools)


def _audio_append(msg: dict) -> AudioAppend:
    b64 = msg.get("audio")
    if not isinstance(b64, str):
        raise RealtimeError(
            "missing_required_parameter", "Missing required parameter: 'audio'.", "audio"
        )
    try:
        return AudioAppend(base64.b64decode(b64, validate=True))
    except (binascii.Error, ValueError):
        raise RealtimeError("invalid_value", "audio is not valid base64", "audio") from None


def _session_update(msg: dict) -> SessionUpdate:
    s = msg.get("session")
    if not isinstance(s, dict):
        raise RealtimeError(
            "missing_required_parameter", "Missing required parameter: 'session'.", "session"
        )
    return SessionUpdate(s)


_DECODERS: dict[str, Callable[[dict], ClientEvent]] = {
    "session.update": _session_update,
    "input_audio_buffer.append": _audio_append,
    "input_audio_buffer.commit": lambda m: AudioCommit(),
    "input_audio_buffer.clear": lambda m: AudioClear(),
    "conversation.item.create": _item_create,
    "response.create": _response_create,
    "response.cancel": lambda m: ResponseCancel(),
    "conversation.item.truncate": _item_truncate,
    "conversation.item.delete": lambda m: ItemDelete(_item_id(m)),
    "conversation.item.retrieve": lambda m: ItemRetrieve(_item_id(m)),
}
CLIENT_TYPES = tuple(_DECODERS)


def decode_client(frame: str | bytes) -> tuple[ClientEvent, str | None]:
    """One client message -> (event, its ``event_id`` if any). Raises :class:`RealtimeError`."""
    if isinstance(frame, bytes):
        raise RealtimeError("invalid_json", "binary frames are not supported; send JSON text")
    try:
        msg = jsontext.loads(frame)
    except jsontext.NotText as exc:
        raise RealtimeError("invalid_value", f"The message is not text: {exc}.") from None
    except jsontext.BadValue as exc:
        raise RealtimeError("invalid_value", f"The message is refused: {exc}.") from None
    except (ValueError, RecursionError):  # RecursionError: nesting deeper than the parser goes
        raise RealtimeError("invalid_json", "The message is not valid JSON.") from None
    if not isinstance(msg, dict):
        raise RealtimeError("invalid_json", "The message must be a JSON object.")
    event_id = msg.get("event_id") if isinstance(msg.get("event_id"), str) else None
    kind = msg.get("type")
    if not isinstance(kind, str):
        raise RealtimeError(
            "missing_required_parameter", "Missing required parameter: 'type'.", "type", event_id
        )
    decoder = _DECODERS.get(kind)
    if decoder is None:
        if kind in UNSUPPORTED:
            raise RealtimeError(
                "unsupported_event", f"'{kind}' is not supported by this server.", "type", event_id
            )
        raise RealtimeError(
            "invalid_value",
            f"Invalid value: '{kind[:64]}'. Supported values are: {', '.join(CLIENT_TYPES)}.",
            "type",
            event_id,
        )
    try:
        return decoder(msg), event_id
    except RealtimeError as exc:
        exc.event_id = event_id
        raise


# ---------------------------------------------------------------- server events


@dataclass(slots=True)
class EventWriter:
    """Encodes typed server events (``protocol/realtime_events.py``) as JSON text, each with a
    fresh ``event_id`` and named in the connection's flavour."""

    flavor: Flavor = Flavor.GA
    _ids: itertools.count = field(default_factory=lambda: itertools.count(1))

    def name(self, ga_name: str) -> str:
        return _BETA_NAMES.get(ga_name, ga_name) if self.flavor is Flavor.BETA else ga_name

    def encode(self, event: events.ServerEvent) -> str:
        event.event_id = f"event_{next(self._ids)}"
        msg = msgspec.to_builtins(event)
        msg["type"] = self.name(msg["type"])
        return json.dumps(msg, ensure_ascii=False, separators=(",", ":"))

    def error(self, exc: RealtimeError) -> str:
        return self.encode(error_event(exc))


def error_event(exc: RealtimeError) -> events.Error:
    """The ``error`` event that answers ``exc``."""
    wire = {
        "type": exc.kind,
        "code": exc.code,
        "message": exc.message,
        "param": exc.param,
        "event_id": exc.event_id,
    }
    return events.Error(error=wire)


def message_item(item_id: str, role: str, status: str, content: list[dict]) -> dict[str, Any]:
    return {
        "id": item_id,
        "object": "realtime.item",
        "type": "message",
        "role": role,
        "status": status,
        "content": content,
    }


def call_item(item_id: str, call_id: str, name: str, arguments: str, status: str) -> dict[str, Any]:
    return {
        "id": item_id,
        "object": "realtime.item",
        "type": "function_call",
        "status": status,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
    }


def output_item(item_id: str, call_id: str, output: str) -> dict[str, Any]:
    return {
        "id": item_id,
        "object": "realtime.item",
        "type": "function_call_output",
        "status": "completed",
        "call_id": call_id,
        "output": output,
    }
