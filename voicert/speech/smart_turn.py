"""Semantic end of turn from the audio: Pipecat's smart-turn v3 model on onnxruntime.

The model (BSD-2-Clause, Daily) ships inside the ``pipecat-ai`` wheel; voicert installs that wheel
``--no-deps`` and only reads the ONNX file from it (no pipecat code is imported). It takes the last
8 s of an utterance as 80 Whisper log-mel bins x 800 frames, the waveform normalised to zero mean
and unit variance first, shorter audio left-padded with zeros, and returns the probability that
the speaker has finished their turn.

:class:`SmartTurn` is the model (synchronous; one call scores a batch). :class:`TurnJudge` is the
client a session awaits: each judgement runs on the judge's own threads, never on the event loop.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Protocol

import numpy as np

from voicert.config import ConfigError
from voicert.packaged import wheel_file

SAMPLE_RATE = 16000
WINDOW_S = 8
N_SAMPLES = SAMPLE_RATE * WINDOW_S  # 128000: the model's input length
_DIST = "pipecat-ai"


class SmartTurnMissing(ConfigError):
    """The model's wheel is not installed (the message says how to install it)."""


def model_path() -> Path:
    """The smart-turn v3 ONNX file inside the installed ``pipecat-ai`` wheel (the newest v3.x
    it ships). Raises SmartTurnMissing."""
    hint = (
        "turn.model=smart_turn needs the smart-turn model from the pipecat-ai wheel: "
        "pip install --no-deps pipecat-ai  (or set turn.model=none, or turn.detector=silence)"
    )
    try:
        return wheel_file(
            _DIST,
            lambda name: name.startswith("smart-turn-v3") and name.endswith(".onnx"),
            hint,
            "has no smart-turn v3 model",
        )
    except ConfigError as exc:
        raise SmartTurnMissing(str(exc)) from None


def mel_extractor():
    """Whisper's log-mel front end (faster-whisper's numpy implementation) for 8 s windows."""
    from faster_whisper.feature_extractor import FeatureExtractor

    return FeatureExtractor(feature_size=80, chunk_length=WINDOW_S)


def features(audio: np.ndarray, extractor) -> np.ndarray:
    """The model's input for one utterance: [N] float32 16 kHz -> [80, 800] float32. Keeps the
    last 8 s; shorter audio is padded with zeros in front (as the model was trained)."""
    x = np.asarray(audio, dtype=np.float32)[-N_SAMPLES:]
    x = np.pad(x, (N_SAMPLES - x.size, 0))
    x = (x - x.mean()) / np.sqrt(x.var() + 1e-7)
    return extractor(x, padding=0).astype(np.float32)  # [80, 800]


class SmartTurn:
    """The model, loaded once. ``threads``: onnxruntime intra-op threads per call. ``device``:
    cpu runs the ONNX file on onnxruntime; cuda[:N] runs the same quantized graph with torch on
    that GPU (speech/onnx_torch.py: its QDQ rounding kept), one batch per call."""

    def __init__(self, path: Path | None = None, threads: int = 1, device: str = "cpu") -> None:
        self.path = path or model_path()
        self.device = device
        self._mel = mel_extractor()
        if device == "cpu":
            import onnxruntime as ort

            opts = ort.SessionOptions()
            opts.intra_op_num_threads = threads
            opts.inter_op_num_threads = 1
            opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
            self._session = ort.InferenceSession(
                str(self.path), sess_options=opts, providers=["CPUExecutionProvider"]
            )
            self._run = lambda batch: self._session.run(None, {"input_features": batch})[0]
        else:
            self._run = _torch_graph(self.path, device)

    def score(self, utterances: list[np.ndarray]) -> np.ndarray:
        """P(turn complete) per utterance ([N] float32 16 kHz each, the audio up to now) -> [B]."""
        batch = np.stack([features(u, self._mel) for u in utterances])  # [B, 80, 800]
        out = self._run(batch)  # [B, 1] sigmoid
        return np.asarray(out, dtype=np.float32).reshape(-1)


def _torch_graph(path: Path, device: str):
    """batch [B, 80, 800] float32 -> [B, 1] P(complete), by torch on ``device`` in fp32 (no
    TF32: the graph's QDQ rounding is sensitive to its inputs' low bits)."""
    import torch

    from voicert.speech.onnx_torch import TorchOnnx

    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    graph = TorchOnnx(path, device)

    def run(batch: np.ndarray) -> np.ndarray:
        return graph.run(input_features=torch.from_numpy(batch)).cpu().numpy()

    return run


class Judge(Protocol):
    """What a session needs of a turn judge (tests give a fake)."""

    async def score(self, audio: np.ndarray) -> float: ...


class TurnJudge:
    """Scores utterances for sessions on threads of its own (ONNX releases the GIL), never on
    the event loop, and in batches: every judgement asked for in one loop iteration goes into
    one model call, at most ``concurrency`` calls at a time; judgements asked for while that
    many run wait and go together in the next call, as soon as one finishes (so under load a
    call grows to what arrived during the last one, rather than calls queueing one by one).
    ``max_batch`` caps a call."""

    def __init__(self, model: SmartTurn, concurrency: int = 1, max_batch: int = 64) -> None:
        self.model = model
        self.concurrency = max(1, concurrency)
        self.max_batch = max(1, max_batch)
        self._pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="voicert-turn")
        self._waiting: list[tuple[np.ndarray, asyncio.Future]] = []
        self._scheduled = False
        self._running = 0
        self.calls = 0  # model calls made, and the judgements they scored (metrics, tests)
        self.judged = 0

    async def score(self, audio: np.ndarray) -> float:
        """P(turn complete) for the utterance so far ([N] float32 16 kHz)."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future = loop.create_future()
        self._waiting.append((audio, fut))
        self._schedule(loop)
        return float(await fut)

    def _schedule(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._waiting and not self._scheduled and self._running < self.concurrency:
            self._scheduled = True
            loop.call_soon(self._flush, loop)

    def _flush(self, loop: asyncio.AbstractEventLoop) -> None:
        self._scheduled = False
        waiting = [(a, f) for a, f in self._waiting if not f.done()]  # (a caller gave up)
        batch, self._waiting = waiting[: self.max_batch], waiting[self.max_batch :]
        if not batch:
            return
        self._running += 1
        self.calls += 1
        self.judged += len(batch)
        run = loop.run_in_executor(self._pool, self.model.score, [a for a, _ in batch])
        run.add_done_callback(lambda r: self._done(batch, r, loop))
        self._schedule(loop)  # more than max_batch waiting: the rest in another call

    def _done(self, batch: list, run: asyncio.Future, loop: asyncio.AbstractEventLoop) -> None:
        self._running -= 1
        exc = run.exception() if not run.cancelled() else asyncio.CancelledError()
        for i, (_, fut) in enumerate(batch):
            if fut.done():
                continue
            if exc is not None:
                fut.set_exception(exc)
            else:
                fut.set_result(run.result()[i])
        self._schedule(loop)  # what arrived meanwhile goes now, as one call

    def warmup(self) -> None:
        """One judgement of silence, so the first caller's does not pay onnxruntime's start."""
        self.model.score([np.zeros(SAMPLE_RATE, np.float32)])

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
