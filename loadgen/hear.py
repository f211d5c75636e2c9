"""What a simulated caller hears and says, in words: the embedded Whisper (tiny.en) run on the
simulator's side of the line, so a phone call's transcript and reply can be printed although a
carrier's media stream carries only audio. Both directions go through the line's G.711 mu-law
at 8 kHz first, so the words are those of the audio the server heard and the caller heard."""

from __future__ import annotations

import numpy as np
import soxr

from voicert.audio.pcm import decode_pcm, encode_audio
from voicert.config import AsrConfig, ConfigError

LINE_RATE = 8000
ASR_RATE = 16000


class Ear:
    """Whisper tiny.en on this process's CPU (loaded once, on the first call)."""

    def __init__(self) -> None:
        self._asr = None

    @staticmethod
    def problem() -> str | None:
        """Why words cannot be heard here (one line), or None."""
        from voicert.speech.asr import embedded_whisper_dir

        try:
            embedded_whisper_dir()
        except ConfigError as exc:
            return f"no transcripts: {exc}"
        return None

    def _model(self):
        if self._asr is None:
            from voicert.speech.asr import WhisperAsr, embedded_whisper_dir

            self._asr = WhisperAsr(AsrConfig(), str(embedded_whisper_dir()))
        return self._asr

    def line(self, mulaw: bytes) -> str:
        """The words in mu-law 8 kHz audio ("" for silence or nothing)."""
        if len(mulaw) < LINE_RATE // 10:
            return ""
        x = decode_pcm(mulaw, "mulaw")  # [N] float32 at 8 kHz
        return self._model().transcribe_sync(soxr.resample(x, LINE_RATE, ASR_RATE)).text.strip()

    def spoken(self, samples: np.ndarray, rate: int) -> str:
        """The words of a clip as the line carries it (resampled to 8 kHz, mu-law)."""
        x = soxr.resample(samples, rate, LINE_RATE) if rate != LINE_RATE else samples
        return self.line(encode_audio(x.astype(np.float32), "mulaw"))
