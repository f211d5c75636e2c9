"""WAV files: read any PCM WAV as mono float32, write 16-bit mono."""

from __future__ import annotations

import wave
from pathlib import Path

import numpy as np

G711 = {6: "alaw", 7: "mulaw"}  # WAVE format tags


PCM, FLOAT, EXTENSIBLE = 1, 3, 0xFFFE  # WAVE format tags (EXTENSIBLE: the real tag is in its GUID)


def _chunks(path: str | Path) -> tuple[bytes, bytes]:
    """(fmt chunk, data chunk) of a RIFF/WAVE file. Raises ValueError when it is not one."""
    data = Path(path).read_bytes()
    if data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        raise ValueError(f"{path}: not a WAV file (no RIFF/WAVE header)")
    pos, fmt, body = 12, None, None
    while pos + 8 <= len(data):
        cid, size = data[pos : pos + 4], int.from_bytes(data[pos + 4 : pos + 8], "little")
        chunk = data[pos + 8 : pos + 8 + size]
        if cid == b"fmt ":
            fmt = chunk
        elif cid == b"data":
            body = chunk
        pos += 8 + size + (size & 1)
    if fmt is None or body is None or len(fmt) < 16:
        raise ValueError(f"{path}: not a WAV file (no fmt or data chunk)")
    return fmt, body


def _format(fmt: bytes) -> tuple[int, int, int, int]:
    """(format tag, channels, rate, bits per sample); EXTENSIBLE resolved to its sub-format."""
    tag = int.from_bytes(fmt[0:2], "little")
    if tag == EXTENSIBLE and len(fmt) >= 26:
        tag = int.from_bytes(fmt[24:26], "little")  # the sub-format GUID's first two bytes
    channels = int.from_bytes(fmt[2:4], "little")
    rate = int.from_bytes(fmt[4:8], "little")
    return tag, channels, rate, int.from_bytes(fmt[14:16], "little")


def read_g711(path: str | Path) -> tuple[bytes, str, int, int] | None:
    """(sample bytes, encoding, rate, channels) of a G.711 WAV (format 6/7), or None."""
    try:
        fmt, body = _chunks(path)
    except ValueError:
        return None
    tag, channels, rate, _ = _format(fmt)
    if tag not in G711:
        return None
    return body, G711[tag], rate, channels


def _samples(raw: bytes, tag: int, bits: int, path) -> np.ndarray:
    """Interleaved samples as float32 in [-1, 1]."""
    if tag == FLOAT and bits in (32, 64):
        return np.frombuffer(raw, "<f4" if bits == 32 else "<f8").astype(np.float32)
    if tag == PCM and bits == 8:
        return (np.frombuffer(raw, np.uint8).astype(np.float32) - 128.0) / 128.0
    if tag == PCM and bits == 16:
        return np.frombuffer(raw, "<i2").astype(np.float32) / 32768.0
    if tag == PCM and bits == 24:
        b = np.frombuffer(raw[: len(raw) // 3 * 3], np.uint8).reshape(-1, 3).astype(np.int32)
        v = b[:, 0] | (b[:, 1] << 8) | (b[:, 2] << 16)
        return (np.where(v >= 1 << 23, v - (1 << 24), v) / float(1 << 23)).astype(np.float32)
    if tag == PCM and bits == 32:
        return np.frombuffer(raw, "<i4").astype(np.float32) / 2147483648.0
    raise ValueError(
        f"{path}: unsupported WAV encoding (format tag {tag}, {bits}-bit); readable: PCM 8/16/24/32"
        "-bit, float 32/64-bit, mu-law, A-law"
    )


def read_wav(path: str | Path) -> tuple[np.ndarray, int]:
    """Return (float32 mono samples [N], sample rate) of a WAV: PCM of 8, 16, 24 or 32 bits,
    IEEE float, or G.711 (mu-law / A-law), plain or WAVE_FORMAT_EXTENSIBLE. Multi-channel audio
    is averaged to mono. Raises ValueError, naming the file, for anything else."""
    fmt, body = _chunks(path)
    tag, channels, rate, bits = _format(fmt)
    if tag in G711:
        from voicert.audio.pcm import decode_pcm

        x = decode_pcm(body, G711[tag])
    else:
        x = _samples(body, tag, bits, path)
    if channels > 1:
        x = x[: x.size // channels * channels].reshape(-1, channels).mean(axis=1)
    return x, rate


def write_wav(path: str | Path, x: np.ndarray, rate: int) -> None:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes((np.clip(x, -1, 1) * 32767).astype("<i2").tobytes())
