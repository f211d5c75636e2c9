"""The speech recogniser's contract: what a session asks of any ASR backend (one Whisper on a
thread, a speech host shared by workers, a streaming recogniser), and the transcript it gets.

A backend declares what it can do in :class:`AsrCapabilities` and the session adapts to it
(LiveKit's ``STTCapabilities`` is the model): every backend transcribes whole utterances by
priority (:meth:`Asr.submit`); one with ``streaming`` also takes an utterance's audio as it
arrives and keeps a running hypothesis (:meth:`Asr.stream`), which live partials and the text
end-of-turn score read without re-decoding. The voice's contract is here too (:class:`Voice`):
what the TTS worker asks of eSpeak NG, Piper or a plug-in voice.

The contract floor: standard library only (audio is a numpy ``[N] float32`` array at 16 kHz;
numpy is named for the type checker only).
"""

from __future__ import annotations

import abc
import asyncio
import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import numpy as np

SAMPLE_RATE = 16000  # what every backend hears


class Priority(enum.IntEnum):
    """A decode's urgency: lower runs first. An int on the wire (the speech host's messages)."""

    FINAL = 0  # a turn's transcript: the caller waits on it
    EARLY = 1  # the final decode begun in the trailing silence, before the endpoint
    PARTIAL = 2  # a live partial of the utterance so far


FINAL, EARLY, PARTIAL = Priority.FINAL, Priority.EARLY, Priority.PARTIAL


class SpeechUnavailable(RuntimeError):
    """A speech model is gone (its worker closed at shutdown, or the speech host process went
    away): a decode, judgement or synthesis failed for that, not for its input. Expected while a
    server stops or a host restarts: one line in the log, not a traceback per session."""


@dataclass(frozen=True, slots=True)
class Ending:
    """What the recogniser would write right after the last word it heard: its probabilities of
    a sentence end (``.``, ``?``, ``!``) and of a pause mark (``,``, ``...``). Whisper punctuates
    from the audio, so where the words alone are ambiguous ("I need eggs | and milk") these carry
    some of the speaker's prosody: an end-of-turn opinion (agent/hazard.py)."""

    stop: float
    comma: float


@dataclass(frozen=True, slots=True)
class TurnAudio:
    """An audio turn model's opinions of a pause (speech/smart_turn.py): its own P(the turn is
    complete), and its pause head's, trained on pauses inside turns (None: it has no head). Both
    are end-of-turn opinions (agent/hazard.py)."""

    complete: float
    pause: float | None = None


@dataclass(frozen=True, slots=True)
class Transcript:
    text: str
    audio_s: float
    decode_ms: float  # time of the batched decode this utterance was part of
    no_speech_prob: float
    avg_logprob: float
    batch: int  # utterances decoded together
    start_ns: int = 0  # when the worker started the decode (perf_counter_ns)
    rejected: bool = False  # the recogniser judged it not to be speech: text is ""
    language: str = "en"  # the language it was decoded in (detected, with asr.language auto)
    ending: Ending | None = None  # after the last word (None: the backend does not say)


@dataclass(frozen=True, slots=True)
class AsrCapabilities:
    """What a backend can do. ``streaming``: :meth:`Asr.stream` takes audio as it arrives.
    ``languages``: the languages it transcribes (ISO 639-1; ``("en",)`` for an English-only
    model)."""

    streaming: bool = False
    languages: tuple[str, ...] = ("en",)


class AsrHandle(Protocol):
    """A queued or running decode: await ``future`` for its :class:`Transcript`."""

    future: asyncio.Future[Transcript]

    @property
    def started(self) -> bool:
        """The backend has begun decoding it (it can no longer be dropped)."""
        ...

    def drop(self) -> bool:
        """Withdraw a decode not yet started (its future is cancelled); False once it runs (its
        result still comes, and is for nobody)."""
        ...


class AsrStream(Protocol):
    """One utterance heard as it arrives (a backend with ``capabilities.streaming``)."""

    def push(self, audio: np.ndarray) -> None:
        """The next samples, ``[N] float32`` 16 kHz, in order."""
        ...

    def hypothesis(self) -> Transcript | None:
        """The running transcript of what was pushed so far (None before the first one)."""
        ...

    async def finish(self) -> Transcript:
        """No more audio: the utterance's final transcript."""
        ...

    def close(self) -> None:
        """Forget the utterance (a turn dropped, a session closed)."""
        ...


class Asr(Protocol):
    """What the session, the server and the metrics may ask of any recogniser.

    ``submit`` is called on the event loop and returns at once; ``pending`` counts the decodes
    queued or running (partials back off while it is above zero). ``alive`` is False while the
    backend cannot decode (its worker died and is being replaced, its host reconnects);
    ``on_give_up`` is set by the server and called once if the backend stops for good.
    ``drain_batch_sizes`` hands the metrics the batch sizes since the last call."""

    capabilities: AsrCapabilities
    on_give_up: Callable[[str], None] | None

    def submit(self, audio: np.ndarray, priority: int = FINAL) -> AsrHandle: ...

    async def transcribe(self, audio: np.ndarray, priority: int = FINAL) -> Transcript: ...

    def stream(self) -> AsrStream: ...

    def pending(self) -> int: ...

    @property
    def alive(self) -> bool: ...

    def drain_batch_sizes(self) -> list[int]: ...

    def warmup(self) -> None: ...

    def close(self) -> None: ...


class AsrBase(abc.ABC):
    """:class:`Asr` with the defaults of a backend that decodes whole utterances only, in
    English. Subclasses implement ``submit``, ``pending`` and ``close``."""

    capabilities = AsrCapabilities()
    on_give_up: Callable[[str], None] | None = None

    @abc.abstractmethod
    def submit(self, audio: np.ndarray, priority: int = FINAL) -> AsrHandle: ...

    @abc.abstractmethod
    def pending(self) -> int: ...

    @abc.abstractmethod
    def close(self) -> None: ...

    async def transcribe(self, audio: np.ndarray, priority: int = FINAL) -> Transcript:
        return await self.submit(audio, priority).future

    def stream(self) -> AsrStream:
        raise NotImplementedError(
            f"{type(self).__name__} transcribes whole utterances only "
            "(capabilities.streaming is False)"
        )

    @property
    def alive(self) -> bool:
        return True

    def drain_batch_sizes(self) -> list[int]:
        return []

    def warmup(self) -> None:
        return None


# ---------------------------------------------------------------- speech out

OnChunk = Callable[["np.ndarray"], bool]  # float32 [N] at the voice's rate; False: stop this piece


class Voice(Protocol):
    """What the TTS worker and the server use of a voice. The built-in voices implement it over
    :class:`VoiceBase`; a plug-in voice needs only ``sample_rate`` and ``synthesize`` and is
    given the rest by :class:`voicert.speech.tts.PluginVoice`."""

    sample_rate: int  # of the chunks it makes
    name: str  # what the log calls it
    voice_id: str  # what a session picks it by ("": its name)

    def synthesize(self, text: str, on_chunk: OnChunk) -> None:
        """Speak ``text``: call ``on_chunk`` (on the calling thread) with each float32 chunk as it is
        made, in order, until done or until ``on_chunk`` returns False. Blocking."""

    def synthesize_first(self, text: str, on_chunk: OnChunk) -> None:
        """:meth:`synthesize` for a reply's first piece, which the caller is waiting on (Piper:
        on sessions with more threads, ``tts.first_threads``)."""

    def warmup(self) -> None:
        """Make the first pieces fast (a voice's first runs are slow); may speak and discard."""


class VoiceBase(abc.ABC):
    """:class:`Voice`'s defaults: a first piece spoken as any other, nothing to warm up.
    Subclasses implement ``synthesize`` and set ``sample_rate``."""

    sample_rate: int
    name: str = ""
    voice_id: str = ""

    @abc.abstractmethod
    def synthesize(self, text: str, on_chunk: OnChunk) -> None:
        """As :meth:`Voice.synthesize`."""

    def synthesize_first(self, text: str, on_chunk: OnChunk) -> None:
        self.synthesize(text, on_chunk)

    def warmup(self) -> None:
        """Nothing to warm up."""
        return None
