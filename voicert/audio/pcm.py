"""PCM codecs and resampling to the 16 kHz float32 the speech front-end works in. Pure numpy + soxr."""

from __future__ import annotations

import numpy as np
import soxr

TARGET_RATE = 16000


class AudioFormatError(ValueError):
    """Audio bytes that cannot be decoded in the declared format."""


def decode_pcm(data: bytes, encoding: str) -> np.ndarray:
    """Little-endian mono ``pcm16`` or ``f32`` bytes -> float32 samples in [-1, 1]. [N]

    Raises AudioFormatError for a byte count that is not a whole number of samples, or for
    non-finite float samples."""
    if encoding == "pcm16":
        if len(data) % 2:
            raise AudioFormatError(f"pcm16 audio must have an even byte count, got {len(data)}")
        return np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768.0
    if encoding == "f32":
        if len(data) % 4:
            raise AudioFormatError(f"f32 audio byte count must be a multiple of 4, got {len(data)}")
        x = np.frombuffer(data, dtype="<f4").astype(np.float32)
        if not np.isfinite(x).all():
            raise AudioFormatError("f32 audio contains NaN or infinite samples")
        return np.clip(x, -1.0, 1.0)
    raise AudioFormatError(f"unknown encoding {encoding!r}")


def encode_pcm16(x: np.ndarray) -> bytes:
    """float32 samples [N] -> little-endian pcm16 bytes (clipped)."""
    return (np.clip(x, -1.0, 1.0) * 32767.0).astype("<i2").tobytes()


class StreamResampler:
    """Streaming resampler from ``rate`` to 16 kHz (soxr, high quality). Identity at 16 kHz."""

    def __init__(self, rate: int) -> None:
        self.rate = rate
        self._stream = None if rate == TARGET_RATE else soxr.ResampleStream(
            rate, TARGET_RATE, 1, dtype="float32", quality="HQ")

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """[N] at ``rate`` -> [M] at 16 kHz; output may lag input by the filter delay."""
        if self._stream is None:
            return x
        return self._stream.resample_chunk(x)
