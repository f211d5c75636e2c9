"""A session's settings and its typed errors: what every door (native, Realtime, Twilio and
the other telephony providers) decodes its own wire format into, and what the session raises
when a client asks for something it cannot have.

The contract floor: standard library only.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from voicert.core.chat import ToolChoice, ToolSpec

ENCODINGS = ("pcm16", "f32", "mulaw", "alaw")
TURN_DETECTION = ("server_vad", "manual")
END_OF_TURN = ("semantic", "silence", "hazard")


class ErrorCode(str, enum.Enum):  # noqa: UP042 - str() and format() stay as they were on the wire
    """Stable error codes sent in ``error`` events. Never renamed; new ones may be added."""

    MALFORMED = "malformed_message"  # not msgpack / not JSON / not a map
    INVALID = "invalid_message"  # a field is missing or has the wrong type or value
    UNKNOWN_TYPE = "unknown_type"
    NO_SESSION = "session_not_started"  # audio or commit before session.start
    ALREADY_STARTED = "session_already_started"
    UNSUPPORTED_SAMPLE_RATE = "unsupported_sample_rate"
    UNSUPPORTED_ENCODING = "unsupported_encoding"
    UNSUPPORTED_VERSION = "unsupported_protocol_version"
    BAD_AUDIO = "bad_audio"  # odd byte count, NaN / inf samples
    MESSAGE_TOO_LARGE = "message_too_large"
    RATE_LIMITED = "rate_limited"  # over server.max_messages_per_s: the connection is closed (1008)
    AUDIO_TOO_FAST = (
        "audio_too_fast"  # audio past server.max_audio_rate: frames dropped (not fatal)
    )
    SERVER_BUSY = "server_busy"
    SESSION_LIMIT = "session_limit"  # server.max_sessions reached: the connection is closed (1013)
    TEXT_TOO_LONG = "text_too_long"  # a text over server.max_text_chars; nothing was added
    START_TIMEOUT = "start_timeout"  # no session.start within server.start_timeout_s (closed, 1008)
    IDLE_TIMEOUT = (
        "idle_timeout"  # nothing from the client for server.idle_timeout_s (closed, 1000)
    )
    SHUTTING_DOWN = "shutting_down"
    NO_SPEECH_OUTPUT = (
        "speech_output_unavailable"  # output_audio asked of a server with tts.engine none
    )
    ASR_FAILED = "asr_failed"
    ENGINE_FAILED = "engine_failed"
    INTERNAL = "internal_error"


class SessionRefused(Exception):
    """What a client asked for cannot be had: a typed ``code`` and a message for the client.
    Raised by the codecs (a malformed message) and by the session (a text too long, a tool
    that clashes); each door sends it as its own error event. Wire codecs know it as
    ``ProtocolError``."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True, slots=True)
class OutputAudio:
    """The format the client wants the reply's speech in."""

    encoding: str = "pcm16"  # one of ENCODINGS
    sample_rate: int = 24000


@dataclass(slots=True)
class SessionSettings:
    """How a session runs, whichever door opened it. None: the server's configured value."""

    sample_rate: int = 16000  # of the caller's audio
    encoding: str = "pcm16"  # of the caller's audio, one of ENCODINGS
    system_prompt: str | None = None
    turn_detection: str = "server_vad"  # one of TURN_DETECTION; "manual": only a commit ends a turn
    max_new_tokens: int | None = None
    output_audio: OutputAudio | None = None  # None: text only; else the reply is spoken too
    tools: tuple[ToolSpec, ...] = ()  # functions the client runs when the model calls them
    tool_choice: ToolChoice | None = None  # None: the server's tools.choice
    end_of_turn: str | None = None  # one of END_OF_TURN; None: the server's turn.detector
    silence_ms: int | None = None  # silence: the trailing silence that ends a turn; semantic: the
    # longest wait after an utterance judged incomplete
    vad_threshold: float | None = None  # speech probability that counts as speech (0-1)
    voice: str | None = None  # one of the server's voices; None: its default
    temperature: float | None = None  # replies sampled at this temperature (0-2); None or 0: greedy
    top_p: float | None = None  # sampled replies: the nucleus (0-1]; None: 1 (all)
    top_k: int | None = None  # sampled replies: the k most likely tokens only; None or 0: all
    seed: int | None = None  # sampled replies: the same seed, the same draws
