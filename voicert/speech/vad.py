"""Streaming Silero VAD (the ONNX model faster-whisper ships) through onnxruntime.

One :class:`SileroVad` holds the ONNX session and is shared by all sessions (``InferenceSession.run`` is
thread-safe); each session owns a :class:`VadStream` with its recurrent state and audio context.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np
import onnxruntime

SAMPLE_RATE = 16000
FRAME = 512  # samples per VAD window: 32 ms at 16 kHz
CONTEXT = 64  # samples of the previous window the model sees in front of each window


def silero_model_path() -> str:
    """Path of the Silero VAD ONNX file inside the installed faster-whisper package."""
    import faster_whisper

    assets = os.path.join(os.path.dirname(faster_whisper.__file__), "assets")
    names = sorted(n for n in os.listdir(assets) if n.startswith("silero") and n.endswith(".onnx"))
    if not names:
        raise FileNotFoundError(f"no Silero VAD ONNX model in {assets}")
    return os.path.join(assets, names[-1])


class SileroVad:
    """The shared model. ``probs`` scores consecutive 32 ms windows of one stream."""

    def __init__(self, path: str | None = None) -> None:
        opts = onnxruntime.SessionOptions()
        opts.inter_op_num_threads = 1
        opts.intra_op_num_threads = 1
        opts.log_severity_level = 4
        self.session = onnxruntime.InferenceSession(
            path or silero_model_path(), providers=["CPUExecutionProvider"], sess_options=opts)

    def probs(self, windows: np.ndarray, state: "VadState") -> np.ndarray:
        """windows: [W, FRAME] float32 consecutive audio -> speech probabilities [W].

        Updates ``state`` (recurrent h/c and the context tail) in place."""
        tails = np.concatenate([state.context[None, :], windows[:-1, -CONTEXT:]], axis=0)  # [W, 64]
        x = np.concatenate([tails, windows], axis=1).astype(np.float32)  # [W, 576]
        out, state.h, state.c = self.session.run(None, {"input": x, "h": state.h, "c": state.c})
        state.context = windows[-1, -CONTEXT:].copy()
        return out.reshape(-1)


@dataclass(slots=True)
class VadState:
    h: np.ndarray = field(default_factory=lambda: np.zeros((1, 1, 128), np.float32))
    c: np.ndarray = field(default_factory=lambda: np.zeros((1, 1, 128), np.float32))
    context: np.ndarray = field(default_factory=lambda: np.zeros(CONTEXT, np.float32))


class VadStream:
    """Per-session framing: push any number of 16 kHz samples, get one probability per full window."""

    def __init__(self, model: SileroVad) -> None:
        self.model = model
        self.state = VadState()
        self._pending = np.zeros(0, np.float32)
        self.windows_done = 0

    def completes_window(self, n: int) -> bool:
        """Whether pushing ``n`` more samples completes a window (and so runs the model)."""
        return self._pending.size + n >= FRAME

    def push(self, samples: np.ndarray) -> np.ndarray:
        """samples [N] float32 16 kHz -> probabilities [W] for the windows completed by this push."""
        buf = np.concatenate([self._pending, samples]) if self._pending.size else samples
        n = buf.size // FRAME
        self._pending = buf[n * FRAME:].copy()
        if n == 0:
            return np.zeros(0, np.float32)
        self.windows_done += n
        return self.model.probs(buf[: n * FRAME].reshape(n, FRAME), self.state)
