"""The native voicert protocol, version 1 (see ``docs/protocol.md``). Sans-I/O: bytes or text in,
typed events out; typed events in, bytes or text out. No sockets and no asyncio here.

Every WebSocket message is one map with a ``type`` key. Binary frames carry msgpack (audio as raw
bytes); text frames carry JSON with the same schema (audio as base64). Decoding never raises anything
but :class:`ProtocolError`, whose ``code`` is one of :class:`ErrorCode`.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Union, get_args

import msgpack

from voicert.core import events as ev
from voicert.core.chat import ToolChoice, ToolSpec
from voicert.core.llm import Sampling, sampling_problem
from voicert.core.session import (
    END_OF_TURN,
    TURN_DETECTION,
    ErrorCode,
    OutputAudio,
    SessionRefused,
    SessionSettings,
)
from voicert.protocol import jsontext
from voicert.protocol.tools import WireError, choice_from_wire, choice_to_wire, tools_from_wire

PROTOCOL_VERSION = 1
# options a session.start may leave out (None: the server's setting), sent only when set
OPTIONAL_OPTIONS = (
    "end_of_turn",
    "silence_ms",
    "vad_threshold",
    "voice",
    "temperature",
    "top_p",
    "top_k",
    "seed",
)
SESSION_OPTIONS = frozenset(
    {
        "turn_detection",
        "max_new_tokens",
        "output_audio",
        "tools",
        "tool_choice",
        *OPTIONAL_OPTIONS,
    }
)


ProtocolError = SessionRefused  # the codecs' one exception type


# ---------------------------------------------------------------- client -> server


@dataclass(slots=True)
class SessionStart(SessionSettings):
    """``session.start``: the session's settings (``core/session.py``) and the protocol version."""

    protocol_version: int = PROTOCOL_VERSION
    type: str = field(default="session.start", init=False)


@dataclass(slots=True)
class SessionUpdate:
    """Change the tools, the tool choice, the system prompt or the voice mid-session (None:
    unchanged). A new voice speaks from the next reply on."""

    tools: tuple[ToolSpec, ...] | None = None
    tool_choice: ToolChoice | None = None
    system_prompt: str | None = None
    voice: str | None = None
    type: str = field(default="session.update", init=False)


@dataclass(slots=True)
class ToolResultIn:
    """The output of a call the client ran (``tool.call`` gave its ``call_id``)."""

    call_id: str
    output: str
    respond: bool = True  # once no call waits for its output, the reply goes on
    type: str = field(default="tool.result", init=False)


@dataclass(slots=True)
class Audio:
    audio: bytes
    type: str = field(default="audio", init=False)


@dataclass(slots=True)
class AudioCommit:
    type: str = field(default="audio.commit", init=False)


@dataclass(slots=True)
class ResponseCancel:
    type: str = field(default="response.cancel", init=False)


@dataclass(slots=True)
class SessionEnd:
    type: str = field(default="session.end", init=False)


@dataclass(slots=True)
class UserText:
    text: str  # a typed user turn, added to the conversation
    respond: bool = True  # reply to it now (as after a spoken turn)
    type: str = field(default="user.text", init=False)


ClientEvent = Union[
    SessionStart,
    Audio,
    AudioCommit,
    ResponseCancel,
    SessionEnd,
    UserText,
    SessionUpdate,
    ToolResultIn,
]

# ---------------------------------------------------------------- server -> client


@dataclass(slots=True)
class SessionStarted:
    session_id: str
    sample_rate: int
    encoding: str
    turn_detection: str
    output_audio: OutputAudio | None = None
    protocol_version: int = PROTOCOL_VERSION
    voice: str | None = None  # the voice replies speak in (None: no speech output)
    voices: tuple[str, ...] = ()  # the voices the session may pick (options.voice, session.update)
    model: str = ""  # the model that answers (server-wide: `voicert serve --llm`)
    type: str = field(default="session.started", init=False)


@dataclass(slots=True)
class SpeechStarted:
    audio_ms: int  # position in the session's input audio
    turn_id: int = 0  # the turn this utterance will become if it ends in a transcript
    type: str = field(default="vad.speech_started", init=False)


@dataclass(slots=True)
class BargeIn:
    turn_id: int = 0  # the utterance that interrupts the agent
    type: str = field(default="vad.barge_in", init=False)


@dataclass(slots=True)
class SpeechStopped:
    audio_ms: int
    turn_id: int = 0
    type: str = field(default="vad.speech_stopped", init=False)


@dataclass(slots=True)
class TranscriptPartial:
    turn_id: int  # the turn this utterance will become
    stable: str  # words two consecutive decodes agreed on (LocalAgreement-2); only ever grows
    unstable: str  # the rest of the latest decode; may change
    type: str = field(default="transcript.partial", init=False)


@dataclass(slots=True)
class TranscriptFinal:
    turn_id: int
    text: str
    language: str = "en"  # what the recogniser heard (detected with asr.language auto)
    type: str = field(default="transcript.final", init=False)


@dataclass(slots=True)
class ResponseStarted:
    turn_id: int
    type: str = field(default="response.started", init=False)


@dataclass(slots=True)
class ResponseAudio:
    turn_id: int
    seq: int  # 0-based chunk number within the reply
    audio: bytes  # the reply's speech in the session's output_audio format (base64 in JSON)
    text: str = ""  # the sentence or clause this chunk begins, "" for the rest of it
    type: str = field(default="response.audio", init=False)


@dataclass(slots=True)
class ResponseToken:
    turn_id: int
    index: int
    text: str  # the text delta this token adds
    type: str = field(default="response.token", init=False)


@dataclass(slots=True)
class ResponseDone:
    turn_id: int
    text: str
    tokens: int
    prompt_tokens: int
    finish_reason: str  # stop | length | cancelled | interrupted | error
    tool_calls: list[str] = field(
        default_factory=list
    )  # calls waiting for the client's tool.result
    type: str = field(default="response.done", init=False)


@dataclass(slots=True)
class ToolCallStarted:
    turn_id: int
    call_id: str
    name: str
    type: str = field(default="tool.call.started", init=False)


@dataclass(slots=True)
class ToolCallDelta:
    turn_id: int
    call_id: str
    delta: str  # more of the arguments' JSON text
    type: str = field(default="tool.call.delta", init=False)


@dataclass(slots=True)
class ToolCallOut:
    """A complete call. ``server``: the server runs it (a ``tool.output`` follows); else the
    client runs it and answers with ``tool.result``."""

    turn_id: int
    call_id: str
    name: str
    arguments: str  # JSON text of an object, valid against the tool's schema
    server: bool = False
    type: str = field(default="tool.call", init=False)


@dataclass(slots=True)
class ToolOutput:
    turn_id: int
    call_id: str
    output: str
    error: bool = False
    type: str = field(default="tool.output", init=False)


@dataclass(slots=True)
class TurnLatency:
    turn_id: int
    stages: dict[str, float]  # stage name -> ms; see voicert.telemetry.latency.STAGES
    early_asr: bool = False  # the final transcript came from the decode begun in trailing silence
    early_prefill: bool = False  # the reply's prompt was prefilled before the endpoint
    type: str = field(default="turn.latency", init=False)


@dataclass(slots=True)
class Error:
    code: str
    message: str
    fatal: bool = False  # the server closes the session after a fatal error
    type: str = field(default="error", init=False)


@dataclass(slots=True)
class SessionEnded:
    reason: str
    type: str = field(default="session.ended", init=False)


ServerEvent = Union[
    SessionStarted,
    SpeechStarted,
    BargeIn,
    SpeechStopped,
    TranscriptPartial,
    TranscriptFinal,
    ResponseStarted,
    ResponseToken,
    ResponseAudio,
    ResponseDone,
    ToolCallStarted,
    ToolCallDelta,
    ToolCallOut,
    ToolOutput,
    TurnLatency,
    Error,
    SessionEnded,
]


def from_core(event: ev.SessionEvent) -> ServerEvent:
    """A session's event (voicert.core.events) as the native protocol's server event."""
    if isinstance(event, ev.ReplyToken):
        return ResponseToken(event.turn_id, event.index, event.text)
    if isinstance(event, ev.ReplyAudio):
        return ResponseAudio(event.turn_id, event.seq, event.audio, event.text)
    if isinstance(event, ev.SpeechStarted):
        return SpeechStarted(event.audio_ms, event.turn_id)
    if isinstance(event, ev.BargeIn):
        return BargeIn(event.turn_id)
    if isinstance(event, ev.SpeechStopped):
        return SpeechStopped(event.audio_ms, event.turn_id)
    if isinstance(event, ev.TranscriptPartial):
        return TranscriptPartial(event.turn_id, event.stable, event.unstable)
    if isinstance(event, ev.TranscriptFinal):
        return TranscriptFinal(event.turn_id, event.text, event.language)
    if isinstance(event, ev.ReplyStarted):
        return ResponseStarted(event.turn_id)
    if isinstance(event, ev.ReplyDone):
        return ResponseDone(
            event.turn_id,
            event.text,
            event.tokens,
            event.prompt_tokens,
            event.finish_reason.value,
            list(event.calls),
        )
    if isinstance(event, ev.ToolCallStarted):
        return ToolCallStarted(event.turn_id, event.call_id, event.name)
    if isinstance(event, ev.ToolCallArguments):
        return ToolCallDelta(event.turn_id, event.call_id, event.delta)
    if isinstance(event, ev.ToolCallDone):
        return ToolCallOut(
            event.turn_id, event.call_id, event.name, event.arguments, event.runs_on_server
        )
    if isinstance(event, ev.ToolResult):
        return ToolOutput(event.turn_id, event.call_id, event.output, event.error)
    if isinstance(event, ev.TurnLatency):
        return TurnLatency(event.turn_id, event.stages, event.early_asr, event.early_prefill)
    if isinstance(event, ev.SessionError):
        return Error(event.code, event.message, event.fatal)
    raise TypeError(f"no native event for {type(event).__name__}")


# ---------------------------------------------------------------- decoding


def _field(msg: dict, name: str, typ: type | tuple[type, ...], default: Any = ...) -> Any:
    if name not in msg or msg[name] is None:
        if default is ...:
            raise ProtocolError(ErrorCode.INVALID, f"{msg.get('type')}: missing field '{name}'")
        return default
    value = msg[name]
    if not isinstance(value, typ) or (typ is int and isinstance(value, bool)):
        want = typ.__name__ if isinstance(typ, type) else "/".join(t.__name__ for t in typ)
        raise ProtocolError(ErrorCode.INVALID, f"{msg.get('type')}: field '{name}' must be {want}")
    return value


def _session_start(msg: dict) -> SessionStart:
    version = _field(msg, "protocol_version", int, PROTOCOL_VERSION)
    if version != PROTOCOL_VERSION:
        raise ProtocolError(
            ErrorCode.UNSUPPORTED_VERSION,
            f"protocol_version {version} not supported (this server speaks {PROTOCOL_VERSION})",
        )
    options = _field(msg, "options", dict, {})
    unknown = sorted(set(options) - SESSION_OPTIONS)
    if unknown:  # said, not ignored: a misspelt option would otherwise just not apply
        raise ProtocolError(
            ErrorCode.INVALID,
            f"options: unknown {', '.join(unknown)[:200]} "
            f"(known: {', '.join(sorted(SESSION_OPTIONS))})",
        )
    turn = _field(options, "turn_detection", str, "server_vad")
    if turn not in TURN_DETECTION:
        raise ProtocolError(
            ErrorCode.INVALID, f"options.turn_detection must be one of {', '.join(TURN_DETECTION)}"
        )
    max_new = _field(options, "max_new_tokens", int, None)
    if max_new is not None and not 1 <= max_new <= 4096:
        raise ProtocolError(ErrorCode.INVALID, "options.max_new_tokens must be in [1, 4096]")
    out = _field(options, "output_audio", dict, None)
    output_audio = (
        None
        if out is None
        else OutputAudio(
            _field(out, "encoding", str, "pcm16"), _field(out, "sample_rate", int, 24000)
        )
    )
    tools, choice = _tools(options, "options.")
    end_of_turn = _field(options, "end_of_turn", str, None)
    if end_of_turn is not None and end_of_turn not in END_OF_TURN:
        raise ProtocolError(
            ErrorCode.INVALID, f"options.end_of_turn must be one of {', '.join(END_OF_TURN)}"
        )
    silence_ms = _field(options, "silence_ms", int, None)
    if silence_ms is not None and not 32 <= silence_ms <= 10000:
        raise ProtocolError(ErrorCode.INVALID, "options.silence_ms must be in [32, 10000]")
    vad_threshold = _field(options, "vad_threshold", (int, float), None)
    if vad_threshold is not None and not 0 < vad_threshold < 1:
        raise ProtocolError(ErrorCode.INVALID, "options.vad_threshold must be in (0, 1)")
    voice = _field(options, "voice", str, None)
    temperature = _field(options, "temperature", (int, float), None)
    if temperature is not None and (isinstance(temperature, bool) or not 0 <= temperature <= 2):
        raise ProtocolError(ErrorCode.INVALID, "options.temperature must be a number in [0, 2]")
    top_p, top_k, seed = _sampled(options, temperature)
    return SessionStart(
        sample_rate=_field(msg, "sample_rate", int, 16000),
        encoding=_field(msg, "encoding", str, "pcm16"),
        system_prompt=_field(msg, "system_prompt", str, None),
        turn_detection=turn,
        max_new_tokens=max_new,
        output_audio=output_audio,
        protocol_version=version,
        tools=tools or (),
        tool_choice=choice,
        end_of_turn=end_of_turn,
        silence_ms=silence_ms,
        vad_threshold=None if vad_threshold is None else float(vad_threshold),
        voice=voice,
        temperature=None if temperature is None else float(temperature),
        top_p=top_p,
        top_k=top_k,
        seed=seed,
    )


def _sampled(
    options: dict, temperature: float | None
) -> tuple[float | None, int | None, int | None]:
    """options.top_p (0-1], top_k (>= 0, 0: all) and seed, in the ranges the engine takes
    (:func:`~voicert.core.llm.sampling_problem`): they shape sampled replies, so they are refused
    (not ignored) without a temperature above 0."""
    top_p = _field(options, "top_p", (int, float), None)
    top_k = _field(options, "top_k", int, None)
    seed = _field(options, "seed", int, None)
    asked = Sampling(temperature or 0.0, 1.0 if top_p is None else top_p, top_k or 0, seed)
    if problem := sampling_problem(asked):
        raise ProtocolError(ErrorCode.INVALID, f"options.{problem}")
    given = [n for n, v in (("top_p", top_p), ("top_k", top_k), ("seed", seed)) if v is not None]
    if given and not temperature:
        raise ProtocolError(
            ErrorCode.INVALID,
            f"options.{given[0]} shapes sampled replies: set options.temperature above 0 too",
        )
    return None if top_p is None else float(top_p), top_k, seed


def _tools(msg: dict, prefix: str) -> tuple[tuple[ToolSpec, ...] | None, ToolChoice | None]:
    """A message's ``tools`` and ``tool_choice`` (None when absent)."""
    try:
        tools = (
            tools_from_wire(msg["tools"], f"{prefix}tools")
            if msg.get("tools") is not None
            else None
        )
        choice = (
            choice_from_wire(msg["tool_choice"], f"{prefix}tool_choice")
            if msg.get("tool_choice") is not None
            else None
        )
    except WireError as exc:
        raise ProtocolError(ErrorCode.INVALID, str(exc)) from None
    return tools, choice


def _session_update(msg: dict) -> SessionUpdate:
    tools, choice = _tools(msg, "")
    return SessionUpdate(
        tools, choice, _field(msg, "system_prompt", str, None), _field(msg, "voice", str, None)
    )


def _tool_result(msg: dict) -> ToolResultIn:
    output = msg.get("output")
    if output is not None and not isinstance(output, str):
        try:  # an object is sent on as its JSON
            output = json.dumps(output, allow_nan=False)
        except (TypeError, ValueError):
            raise ProtocolError(
                ErrorCode.INVALID, "tool.result: 'output' must be a string or a JSON value"
            ) from None
    if output is None:
        raise ProtocolError(ErrorCode.INVALID, "tool.result: missing field 'output'")
    return ToolResultIn(_field(msg, "call_id", str), output, _field(msg, "respond", bool, True))


def _audio(msg: dict, text_frame: bool) -> Audio:
    if text_frame:
        b64 = _field(msg, "audio", str)
        try:
            data = base64.b64decode(b64, validate=True)
        except (binascii.Error, ValueError):
            raise ProtocolError(
                ErrorCode.INVALID, "audio: field 'audio' is not valid base64"
            ) from None
    else:
        data = _field(msg, "audio", (bytes, bytearray))
    return Audio(audio=bytes(data))


_DECODERS: dict[str, Callable[[dict, bool], ClientEvent]] = {
    "session.start": lambda m, t: _session_start(m),
    "audio": _audio,
    "audio.commit": lambda m, t: AudioCommit(),
    "response.cancel": lambda m, t: ResponseCancel(),
    "session.end": lambda m, t: SessionEnd(),
    "user.text": lambda m, t: UserText(_field(m, "text", str), _field(m, "respond", bool, True)),
    "session.update": lambda m, t: _session_update(m),
    "tool.result": lambda m, t: _tool_result(m),
}
CLIENT_TYPES = tuple(_DECODERS)


def decode_client(frame: bytes | str) -> ClientEvent:
    """Parse one WebSocket message (binary: msgpack, text: JSON) into a client event."""
    text_frame = isinstance(frame, str)
    try:
        if text_frame:
            msg = jsontext.loads(frame)
        else:
            msg = msgpack.unpackb(frame, raw=False, strict_map_key=True)
            if len(frame) > jsontext.MAX_DEPTH:  # (a shorter one cannot nest deeper)
                jsontext.check_value(msg)
    except (jsontext.NotText, jsontext.BadValue) as exc:
        raise ProtocolError(ErrorCode.INVALID, str(exc)) from None
    except Exception:  # msgpack raises several unrelated types for garbage input
        codec = "JSON" if text_frame else "msgpack"
        raise ProtocolError(ErrorCode.MALFORMED, f"message is not valid {codec}") from None
    if not isinstance(msg, dict):
        raise ProtocolError(ErrorCode.MALFORMED, "message must be a map with a 'type' key")
    kind = msg.get("type")
    if not isinstance(kind, str):
        raise ProtocolError(ErrorCode.INVALID, "message has no string 'type'")
    decoder = _DECODERS.get(kind)
    if decoder is None:
        raise ProtocolError(
            ErrorCode.UNKNOWN_TYPE,
            f"unknown message type {kind[:64]!r} (known: {', '.join(CLIENT_TYPES)})",
        )
    return decoder(msg, text_frame)


# ---------------------------------------------------------------- encoding


def _to_map(event: ServerEvent | ClientEvent) -> dict[str, Any]:
    d = asdict(event)
    return {"type": d.pop("type"), **d}


def encode(event: ServerEvent | ClientEvent, binary: bool = True) -> bytes | str:
    """Serialise an event: msgpack bytes for a binary frame, JSON text (bytes as base64) otherwise.

    Client events encode too, so clients and tests share this codec."""
    d = _to_map(event)
    if isinstance(event, SessionStart):
        d = {
            "type": d["type"],
            "protocol_version": d["protocol_version"],
            "sample_rate": d["sample_rate"],
            "encoding": d["encoding"],
            "system_prompt": d["system_prompt"],
            "options": {
                "turn_detection": d["turn_detection"],
                "max_new_tokens": d["max_new_tokens"],
                "output_audio": d["output_audio"],
                "tools": [_tool_map(t) for t in event.tools],
                "tool_choice": (choice_to_wire(event.tool_choice) if event.tool_choice else None),
            },
        }
        for name in OPTIONAL_OPTIONS:
            if getattr(event, name) is not None:
                d["options"][name] = getattr(event, name)
    elif isinstance(event, SessionUpdate):
        d = {
            "type": d["type"],
            "system_prompt": event.system_prompt,
            "tools": None if event.tools is None else [_tool_map(t) for t in event.tools],
            "tool_choice": choice_to_wire(event.tool_choice) if event.tool_choice else None,
            "voice": event.voice,
        }
    if binary:
        return msgpack.packb(d, use_bin_type=True)
    if "audio" in d and isinstance(d["audio"], bytes):
        d["audio"] = base64.b64encode(d["audio"]).decode("ascii")
    return json.dumps(d, ensure_ascii=False, separators=(",", ":"))


def _tool_map(spec: ToolSpec) -> dict:
    return {"name": spec.name, "description": spec.description, "parameters": spec.schema}


_SERVER_TYPES = {  # each server event's type tag -> its class (ServerEvent's one list)
    cls.__dataclass_fields__["type"].default: cls for cls in get_args(ServerEvent)
}


def decode_server(frame: bytes | str) -> dict[str, Any]:
    """Parse a server message into a plain map (for clients and tests). Raises ProtocolError."""
    try:
        msg = json.loads(frame) if isinstance(frame, str) else msgpack.unpackb(frame, raw=False)
    except Exception:
        raise ProtocolError(ErrorCode.MALFORMED, "server message is not valid") from None
    if not isinstance(msg, dict) or msg.get("type") not in _SERVER_TYPES:
        raise ProtocolError(ErrorCode.UNKNOWN_TYPE, f"unknown server message {msg!r:.80}")
    return msg
