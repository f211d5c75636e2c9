"""PCM codecs and resampling to the 16 kHz float32 the speech front-end works in. Pure numpy + soxr."""

from __future__ import annotations

import numpy as np
import soxr

TARGET_RATE = 16000


class AudioFormatError(ValueError):
    """Audio bytes that cannot be decoded in the declared format."""


def _mulaw_table() -> np.ndarray:
    """G.711 mu-law byte -> linear 16-bit value. [256]"""
    u = ~np.arange(256, dtype=np.int32) & 0xFF
    exponent, mantissa = (u >> 4) & 0x07, u & 0x0F
    magnitude = (((mantissa << 3) + 0x84) << exponent) - 0x84
    return np.where(u & 0x80, -magnitude, magnitude).astype(np.float32)


def _alaw_table() -> np.ndarray:
    """G.711 A-law byte -> linear 16-bit value. [256]"""
    a = np.arange(256, dtype=np.int32) ^ 0x55
    exponent, mantissa = (a >> 4) & 0x07, a & 0x0F
    magnitude = np.where(
        exponent == 0, (mantissa << 4) + 8, ((mantissa << 4) + 0x108) << np.maximum(exponent - 1, 0)
    )
    return np.where(a & 0x80, magnitude, -magnitude).astype(np.float32)


MULAW = _mulaw_table() / 32768.0
ALAW = _alaw_table() / 32768.0


def decode_pcm(data: bytes, encoding: str) -> np.ndarray:
    """Mono audio bytes -> float32 samples in [-1, 1]. [N]

    Encodings: ``pcm16`` (little-endian int16), ``f32`` (little-endian float32), ``mulaw`` and
    ``alaw`` (G.711, one byte a sample, as telephony sends them). Raises AudioFormatError for a
    byte count that is not a whole number of samples, or for non-finite float samples."""
    if encoding in ("mulaw", "alaw"):
        table = MULAW if encoding == "mulaw" else ALAW
        return table[np.frombuffer(data, dtype=np.uint8)]
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


def _segment(mag: np.ndarray, first_bits: int) -> np.ndarray:
    """G.711 segment of each magnitude: 0 up to ``first_bits`` bits, then one more per bit. [N]"""
    top_bit = np.floor(np.log2(np.maximum(mag, 1))).astype(np.int32)  # [N]
    return np.maximum(top_bit - (first_bits - 1), 0)


def lin2ulaw(x16: np.ndarray) -> np.ndarray:
    """int16 samples [N] -> G.711 mu-law bytes [N] uint8 (the ITU-T / Sun reference rule, 14-bit)."""
    x = x16.astype(np.int32) >> 2
    mask = np.where(x < 0, 0x7F, 0xFF)
    mag = np.minimum(np.abs(x), 8159) + 0x21  # bias so that each segment starts at a power of two
    seg = _segment(mag, 6)  # [N] 0..8; 8 only for the clipped top, which maps to the last code
    code = np.where(seg >= 8, 0x7F, (np.minimum(seg, 7) << 4) | ((mag >> (seg + 1)) & 0x0F))
    return (code ^ mask).astype(np.uint8)


def lin2alaw(x16: np.ndarray) -> np.ndarray:
    """int16 samples [N] -> G.711 A-law bytes [N] uint8 (the ITU-T / Sun reference rule, 13-bit)."""
    x = x16.astype(np.int32) >> 3
    mask = np.where(x >= 0, 0xD5, 0x55)
    mag = np.where(x >= 0, x, -x - 1)
    seg = _segment(mag, 5)  # [N] 0..7 (13-bit magnitudes never exceed 0xFFF)
    low = np.where(seg < 2, mag >> 1, mag >> seg) & 0x0F
    return (((seg << 4) | low) ^ mask).astype(np.uint8)


def encode_audio(x: np.ndarray, encoding: str) -> bytes:
    """float32 samples [N] in [-1, 1] -> bytes in ``pcm16``, ``f32``, ``mulaw`` or ``alaw``."""
    if encoding == "f32":
        return np.clip(x, -1.0, 1.0).astype("<f4").tobytes()
    if encoding == "pcm16":
        return encode_pcm16(x)
    x16 = (np.clip(x, -1.0, 1.0) * 32767.0).astype(np.int16)
    if encoding == "mulaw":
        return lin2ulaw(x16).tobytes()
    if encoding == "alaw":
        return lin2alaw(x16).tobytes()
    raise AudioFormatError(f"unknown encoding {encoding!r}")


class Resampler:
    """Streaming resampler (soxr, high quality) from ``rate_in`` to ``rate_out``; identity if equal.
    Output may lag input by the filter delay until ``last`` flushes it."""

    def __init__(self, rate_in: int, rate_out: int) -> None:
        self._stream = (
            None
            if rate_in == rate_out
            else soxr.ResampleStream(rate_in, rate_out, 1, dtype="float32", quality="HQ")
        )

    def __call__(self, x: np.ndarray, last: bool = False) -> np.ndarray:
        """[N] at rate_in -> [M] at rate_out; ``last`` flushes the filter's tail."""
        if self._stream is None:
            return x
        return self._stream.resample_chunk(x, last=last)


class StreamResampler(Resampler):
    """Client audio at ``rate`` -> the 16 kHz the speech front-end works in."""

    def __init__(self, rate: int) -> None:
        super().__init__(rate, TARGET_RATE)
        self.rate = rate
