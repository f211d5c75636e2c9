"""WAV files: read any PCM WAV as mono float32, write 16-bit mono."""

from __future__ import annotations

import wave
from pathlib import Path

import numpy as np

G711 = {6: "alaw", 7: "mulaw"}  # WAVE format tags


def read_g711(path: str | Path) -> tuple[bytes, str, int, int] | None:
    """(sample bytes, encoding, rate, channels) of a G.711 WAV (format 6/7), or None."""
    data = Path(path).read_bytes()
    if data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        return None
    pos, fmt, body = 12, None, None
    while pos + 8 <= len(data):
        cid, size = data[pos : pos + 4], int.from_bytes(data[pos + 4 : pos + 8], "little")
        chunk = data[pos + 8 : pos + 8 + size]
        if cid == b"fmt ":
            fmt = chunk
        elif cid == b"data":
            body = chunk
        pos += 8 + size + (size & 1)
    if fmt is None or body is None:
        return None
    tag = int.from_bytes(fmt[0:2], "little")
    if tag not in G711:
        return None
    return body, G711[tag], int.from_bytes(fmt[4:8], "little"), int.from_bytes(fmt[2:4], "little")


def read_wav(path: str | Path) -> tuple[np.ndarray, int]:
    """Return (float32 mono samples [N], sample rate) of a PCM or G.711 (mu-law / A-law) WAV.
    Multi-channel audio is averaged to mono."""
    g711 = read_g711(path)
    if g711 is not None:
        from voicert.audio.pcm import decode_pcm

        raw, encoding, rate, channels = g711
        x = decode_pcm(raw, encoding)
        return (x.reshape(-1, channels).mean(axis=1) if channels > 1 else x), rate
    with wave.open(str(path), "rb") as w:
        width, channels, rate = w.getsampwidth(), w.getnchannels(), w.getframerate()
        raw = w.readframes(w.getnframes())
    if width == 2:
        x = np.frombuffer(raw, "<i2").astype(np.float32) / 32768.0
    elif width == 4:
        x = np.frombuffer(raw, "<i4").astype(np.float32) / 2147483648.0
    elif width == 1:
        x = (np.frombuffer(raw, np.uint8).astype(np.float32) - 128.0) / 128.0
    else:
        raise ValueError(f"{path}: unsupported sample width {width} bytes")
    if channels > 1:
        x = x.reshape(-1, channels).mean(axis=1)
    return x, rate


def write_wav(path: str | Path, x: np.ndarray, rate: int) -> None:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes((np.clip(x, -1, 1) * 32767).astype("<i2").tobytes())
