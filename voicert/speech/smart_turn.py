"""Semantic end of turn from the audio: Pipecat's smart-turn v3 model on onnxruntime.

The model (BSD-2-Clause, Daily) ships inside the ``pipecat-ai`` wheel; voicert installs that wheel
``--no-deps`` and only reads the ONNX file from it (no pipecat code is imported). It takes the last
8 s of an utterance as 80 Whisper log-mel bins x 800 frames, the waveform normalised to zero mean
and unit variance first, shorter audio left-padded with zeros, and returns the probability that
the speaker has finished their turn.

:class:`SmartTurn` is the model (synchronous; one call scores a batch). :class:`TurnJudge` is the
client a session awaits: each judgement runs on the judge's own threads, never on the event loop.

:class:`PauseHead` (``turn.audio_head``) is a second classifier on the same forward pass: a
logistic regression on smart-turn's own encoder state (its attention-pooled vector, and the mean
of its last 12 frames, the 240 ms up to the judgement), trained on pauses *inside* turns, which
smart-turn's training lacked: corpus sentences spoken by Piper and eSpeak voices, paused at a
random word, each pause against the turn's end (``scripts/train_pause_head.py``). A judgement
then gives both opinions (core/speech.py ``TurnAudio``): the hazard weighs the head's, the
semantic detector reads smart-turn's own. A head is valid only for the graph it was trained on:
the file carries that graph's sha256.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from voicert.config import ConfigError
from voicert.core.speech import TurnAudio
from voicert.packaged import wheel_file

SAMPLE_RATE = 16000
WINDOW_S = 8
N_SAMPLES = SAMPLE_RATE * WINDOW_S  # 128000: the model's input length
_DIST = "pipecat-ai"
log = logging.getLogger(__name__)
# the graph's values the pause head reads (smart-turn v3's encoder, 384 wide, 20 ms a frame)
LOGITS = "logits"  # [B, 1] smart-turn's own P(complete) (a sigmoid, despite the name)
POOLED = "sum_1_DequantizeLinear_Output"  # [B, 384] the attention-pooled state its classifier reads
FRAMES = "layer_norm_8_DequantizeLinear_Output"  # [B, 400, 384] the encoder's last layer
LAST_FRAMES = 12  # the head reads the mean of the last 12 frames (240 ms) too
EMBEDDED_PAUSE_HEAD = Path(__file__).parent / "data" / "smart-turn-v3.2-pause-head.json"


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


@functools.cache
def graph_digest(path: Path) -> str:
    """The sha256 of an ONNX file (what a pause head is tied to)."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def pause_features(pooled: np.ndarray, frames: np.ndarray) -> np.ndarray:
    """pooled [B, 384], frames [B, T, 384] -> [B, 768]: what the pause head reads."""
    return np.concatenate([pooled, frames[:, -LAST_FRAMES:, :].mean(1)], axis=1)


@dataclass(frozen=True)
class PauseHead:
    """P(turn complete) = sigmoid(features @ weight + bias), ``weight`` [768] on
    :func:`pause_features` of the graph whose sha256 is ``graph``."""

    weight: np.ndarray
    bias: float
    graph: str
    meta: dict

    def prob(self, pooled: np.ndarray, frames: np.ndarray) -> np.ndarray:
        """[B] P(complete) from the graph's pooled state and frames."""
        z = pause_features(pooled, frames).astype(np.float64) @ self.weight + self.bias
        return (1 / (1 + np.exp(-z))).astype(np.float32)

    def save(self, path: Path) -> None:
        data = dict(graph=self.graph, bias=self.bias, weight=self.weight.tolist(), meta=self.meta)
        Path(path).write_text(json.dumps(data))

    @classmethod
    def load(cls, path: Path) -> PauseHead:
        data = json.loads(Path(path).read_text())
        weight = np.asarray(data["weight"], dtype=np.float64)
        return cls(weight, float(data["bias"]), data["graph"], data.get("meta", {}))


def pause_head(setting: str, graph: Path) -> PauseHead | None:
    """The pause head ``turn.audio_head`` names for the smart-turn file ``graph``: ``none``;
    ``auto``: the one voicert ships, where it was trained on this very graph, else none; or a
    head file, which must be (raises ConfigError naming the key)."""
    if setting == "none":
        return None
    path = EMBEDDED_PAUSE_HEAD if setting == "auto" else Path(setting).expanduser()
    if not path.is_file():
        raise ConfigError(f"turn.audio_head: {path} is not a file (a pause head's .json)")
    head = PauseHead.load(path)
    if head.graph != graph_digest(graph):
        if setting == "auto":
            log.warning(
                "turn.audio_head auto: the shipped pause head was trained on another smart-turn "
                "graph than %s; judging without it",
                graph.name,
            )
            return None
        raise ConfigError(
            f"turn.audio_head: {path} was trained on another smart-turn graph than {graph.name}"
        )
    return head


def load(model_file: str = "", device: str = "cpu", audio_head: str = "auto", threads: int = 1):
    """The model as the ``turn`` config names it: ``model_path`` ("" = the wheel's), its
    ``device``, ``audio_head`` and ``threads``. Raises ConfigError naming the key at fault."""
    path = None
    if model_file:
        path = Path(model_file).expanduser()
        if not path.is_file():
            raise ConfigError(f"turn.model_path: {path} is not a file (a smart-turn v3 .onnx)")
    path = path or model_path()
    return SmartTurn(path, threads, device, pause_head(audio_head, path))


class SmartTurn:
    """The model, loaded once. ``threads``: onnxruntime intra-op threads per call. ``device``:
    cpu runs the ONNX file on onnxruntime; cuda[:N] runs the same quantized graph with torch on
    that GPU (speech/onnx_torch.py: its QDQ rounding kept), one batch per call. With ``head``,
    the pause head's opinion comes from the same forward pass (:meth:`opinions`)."""

    def __init__(
        self,
        path: Path | None = None,
        threads: int = 1,
        device: str = "cpu",
        head: PauseHead | None = None,
    ) -> None:
        self.path = path or model_path()
        self.device = device
        self.head = head
        self._mel = mel_extractor()
        names = [LOGITS, POOLED, FRAMES] if head is not None else [LOGITS]
        if device == "cpu":
            self._run = _onnx_graph(self.path, threads, names)
        else:
            self._run = _torch_graph(self.path, device, names)

    def score(self, utterances: list[np.ndarray]) -> np.ndarray:
        """smart-turn's own P(turn complete) per utterance ([N] float32 16 kHz each, the audio
        up to now) -> [B]."""
        return self.score_both(utterances)[0]

    def score_both(self, utterances: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray | None]:
        """(smart-turn's own P(complete) [B], the pause head's [B] or None without one)."""
        batch = np.stack([features(u, self._mel) for u in utterances])  # [B, 80, 800]
        out = self._run(batch)
        own = np.asarray(out[0], dtype=np.float32).reshape(-1)  # [B, 1] sigmoid -> [B]
        return own, None if self.head is None else self.head.prob(out[1], out[2])

    def opinions(self, utterances: list[np.ndarray]) -> list[TurnAudio]:
        """Each utterance's :class:`TurnAudio` (smart-turn's own, and the head's if any)."""
        own, head = self.score_both(utterances)
        if head is None:
            return [TurnAudio(float(o)) for o in own]
        return [TurnAudio(float(o), float(h)) for o, h in zip(own, head)]


def _onnx_graph(path: Path, threads: int, names: list[str]):
    """batch [B, 80, 800] float32 -> the graph's values ``names``, by onnxruntime on the CPU."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    source: str | bytes = str(path)
    if names != [LOGITS]:  # intermediate values become outputs of the graph
        import onnx

        model = onnx.load(str(path))
        for name in names[1:]:
            model.graph.output.append(
                onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None)
            )
        source = model.SerializeToString()
    session = ort.InferenceSession(source, sess_options=opts, providers=["CPUExecutionProvider"])
    return lambda batch: session.run(names, {"input_features": batch})


def _torch_graph(path: Path, device: str, names: list[str]):
    """batch [B, 80, 800] float32 -> the graph's values ``names``, by torch on ``device`` in
    fp32 (no TF32: the graph's QDQ rounding is sensitive to its inputs' low bits)."""
    import torch

    from voicert.speech.onnx_torch import TorchOnnx

    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    graph = TorchOnnx(path, device, outputs=names)

    def run(batch: np.ndarray) -> list[np.ndarray]:
        return [v.cpu().numpy() for v in graph.run_all(input_features=torch.from_numpy(batch))]

    return run


class Judge(Protocol):
    """What a session needs of a turn judge (tests give a fake)."""

    async def score(self, audio: np.ndarray) -> TurnAudio: ...


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

    async def score(self, audio: np.ndarray) -> TurnAudio:
        """The model's opinions of the utterance so far ([N] float32 16 kHz)."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future = loop.create_future()
        self._waiting.append((audio, fut))
        self._schedule(loop)
        return await fut

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
        run = loop.run_in_executor(self._pool, self.model.opinions, [a for a, _ in batch])
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
