"""What a session tells the connection that drives it. Each door maps these onto its own wire
(``protocol/native.py`` onto the native protocol; ``server/realtime.py`` onto Realtime events;
``server/twilio.py`` onto Twilio media, marks and clear); the session knows no wire format.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Union


class ReplyEnd(enum.StrEnum):
    """Why a reply ended (a reply's finish reason; the engine's plus ``interrupted``)."""

    STOP = "stop"
    LENGTH = "length"
    CANCELLED = "cancelled"  # the client cancelled it
    INTERRUPTED = "interrupted"  # the caller talked over it (barge-in), or a new turn replaced it
    ERROR = "error"


@dataclass(frozen=True, slots=True)
class SpeechStarted:
    turn_id: int  # the turn this utterance will become if it ends in a transcript
    audio_ms: int  # position in the session's input audio


@dataclass(frozen=True, slots=True)
class BargeIn:
    """The speaker talks over the agent and that interrupts it: stop the reply and the audio still
    playing. Right after SpeechStarted, or (turn.backchannels, while a reply runs) once the speech
    has gone on for turn.interrupt_ms, or at its end when it was not a backchannel."""

    turn_id: int  # the utterance that interrupts


@dataclass(frozen=True, slots=True)
class SpeechStopped:
    turn_id: int
    audio_ms: int


@dataclass(frozen=True, slots=True)
class TranscriptPartial:
    turn_id: int
    stable: str  # words two consecutive decodes agreed on; only ever grows
    unstable: str  # the rest of the latest decode; may change


@dataclass(frozen=True, slots=True)
class TranscriptFinal:
    turn_id: int
    text: str
    item_id: str = ""  # the conversation item it became ("" when none: no speech found)
    language: str = "en"  # the language the recogniser heard (asr.language; detected with auto)


@dataclass(frozen=True, slots=True)
class ReplyStarted:
    turn_id: int
    spoken: bool  # its speech will follow as ReplyAudio


@dataclass(frozen=True, slots=True)
class ReplyToken:
    turn_id: int
    index: int
    text: str  # the text this token adds


@dataclass(frozen=True, slots=True)
class ReplyAudio:
    turn_id: int
    seq: int  # 0-based chunk number within the reply
    audio: bytes  # encoded in the session's output format
    text: str = ""  # the sentence or clause this chunk begins, "" within one


@dataclass(frozen=True, slots=True)
class ToolCallStarted:
    """The reply calls a tool: its name is decoded, its arguments follow."""

    turn_id: int
    call_id: str
    name: str
    item_id: str  # the function_call item it becomes


@dataclass(frozen=True, slots=True)
class ToolCallArguments:
    turn_id: int
    call_id: str
    delta: str  # more of the arguments' JSON text


@dataclass(frozen=True, slots=True)
class ToolCallDone:
    """A call's arguments are complete (schema-valid when the engine decoded them guided)."""

    turn_id: int
    call_id: str
    name: str
    arguments: str  # JSON text of an object
    item_id: str
    runs_on_server: bool  # a configured tool the server runs; else the client answers it


@dataclass(frozen=True, slots=True)
class ToolResult:
    """A server-side tool's output joined the conversation (the reply goes on after it)."""

    turn_id: int
    call_id: str
    output: str
    item_id: str
    error: bool = False  # the tool failed or timed out (``output`` says how)


@dataclass(frozen=True, slots=True)
class ReplyDone:
    turn_id: int
    text: str
    tokens: int
    prompt_tokens: int
    finish_reason: ReplyEnd
    item_id: str = ""  # the assistant item it became in the conversation ("" when nothing was sent)
    calls: tuple[str, ...] = ()  # ids of the tool calls it made that wait for the client's output
    item_offset: int = 0  # where item_id's text starts in ``text`` (a reply over tool rounds says
    # several messages; ``text`` is all of them, the item the last)


@dataclass(frozen=True, slots=True)
class TurnLatency:
    turn_id: int
    stages: dict[str, float]  # stage name -> ms (telemetry/latency.py)
    early_asr: bool = False
    early_prefill: bool = False


@dataclass(frozen=True, slots=True)
class SessionError:
    code: str  # a stable error code (protocol/native.py ErrorCode values)
    message: str
    fatal: bool = False


SessionEvent = Union[
    SpeechStarted,
    BargeIn,
    SpeechStopped,
    TranscriptPartial,
    TranscriptFinal,
    ReplyStarted,
    ReplyToken,
    ReplyAudio,
    ToolCallStarted,
    ToolCallArguments,
    ToolCallDone,
    ToolResult,
    ReplyDone,
    TurnLatency,
    SessionError,
]
