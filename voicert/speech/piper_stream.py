"""Piper's audio in chunks, while the rest of the sentence is still being made.

A Piper (VITS) voice is one ONNX graph from phoneme ids to audio. Most of its time (about two
thirds) is the decoder, a stack of convolutions that turns the latent frames (one per 256 audio
samples) into audio; the text encoder, the duration predictor and the flow in front of it take
the rest. The graph is split at the decoder's input (``/dec/conv_pre/Conv``, as Piper's exporter
names it) into a *front* (phoneme ids -> latent frames, whole sentence) and a *decoder* that runs
on a window of frames at a time. A convolution stack sees only a bounded span of frames, so a
window decoded with :data:`PAD_FRAMES` frames of context on each side gives the samples the whole
sentence would (tests/speech/test_piper_stream.py checks it against the unsplit graph).

So the first audio of a sentence waits for the front and one small window of the decoder, not
for the decoder over the whole sentence, and a barge-in stops a piece between windows rather than
between sentences.

On onnxruntime's CUDA provider the decoder is fast only on shapes it has seen (a new length costs
~30 ms on an H100, a known one 1-2 ms: docs/benchmarks.md 28). With ``quantum`` each window is
widened, with more of the sentence's own frames as context, to a multiple of that many frames, so
the decoder meets a few dozen lengths, all run once at warm-up. More real context leaves the
window's samples as they were; only a sentence shorter than its length is padded with zeros
after its end (see :func:`fit`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

DECODER_NODE = "/dec/conv_pre/Conv"  # the decoder's first convolution, in Piper's exports
PAD_FRAMES = 16  # context on each side of a window: max |difference| to the whole sentence's
# audio 7e-7 at 16 (peak ~0.5; 2e-5 at 8, 1e-2 at 4)
GROWTH = 4  # each window this many times the one before: one window's decoding takes well under
# the time the one before it plays (the decoder runs ~5x faster than real time on 2 busy cores)
MOST_FRAMES = 512  # up to this many frames (6 s of audio)
CUDA_QUANTUM = 16  # on the CUDA provider, windows are multiples of this many frames (see fit)


@dataclass(frozen=True, slots=True)
class SplitVoice:
    """The two halves of one Piper graph, serialized for onnxruntime. ``latent``: the name of the
    tensor between them (float32 [1, channels, frames]); ``speaker``: the decoder also takes the
    ``sid`` input (multi-speaker voices condition the decoder on it)."""

    front: bytes
    decoder: bytes
    latent: str
    speaker: bool


def split_voice(model: Path) -> SplitVoice | None:
    """The voice's graph split at its decoder's input, or None (logged) when it cannot be: the
    ``onnx`` package is missing, or the graph has no node named :data:`DECODER_NODE` (a voice
    exported some other way). The caller then speaks whole sentences."""
    try:
        import onnx
        import onnx.utils
    except ImportError:
        log.warning("Piper: the onnx package is not installed; sentences are spoken whole")
        return None
    graph_model = onnx.load(str(model))
    graph = graph_model.graph
    conv = next((n for n in graph.node if n.name == DECODER_NODE), None)
    if conv is None:
        log.warning(
            "Piper: %s has no %s node; its sentences are spoken whole", model.name, DECODER_NODE
        )
        return None
    latent = conv.input[0]
    inputs = [i.name for i in graph.input]
    outputs = [o.name for o in graph.output][:1]  # the audio (alignments, if any, stay whole)
    extractor = onnx.utils.Extractor(graph_model)
    front = extractor.extract_model(inputs, [latent])
    speaker = "sid" in inputs
    decoder = extractor.extract_model([latent] + (["sid"] if speaker else []), outputs)
    return SplitVoice(front.SerializeToString(), decoder.SerializeToString(), latent, speaker)


def fit(left: int, right: int, frames: int, quantum: int) -> tuple[int, int]:
    """[left, right) widened to a multiple of ``quantum`` frames: more of the sentence's frames on
    the left first (already spoken), then on the right. Past the sentence's end (a sentence too
    short for the length) ``right`` exceeds ``frames``: the caller pads with zeros there, as VITS
    pads a batch (measured: the last 16 frames' samples move by ~1e-4 on a peak of 0.5, where
    the sentence has faded to an rms of ~4e-4). ``quantum`` 0: unchanged."""
    if quantum <= 0:
        return left, right
    want = -(-(right - left) // quantum) * quantum
    if want > frames:
        return 0, want
    left = max(0, right - want)
    return left, left + want


def windows(frames: int, first: int, most: int = MOST_FRAMES) -> list[tuple[int, int]]:
    """[lo, hi) frame spans covering ``frames`` in order: ``first`` frames, then each window
    :data:`GROWTH` times the one before, up to ``most``. Small first (the caller is waiting),
    larger after (each window decodes up to 2 x PAD_FRAMES of context again)."""
    spans, lo, size = [], 0, max(1, first)
    while lo < frames:
        hi = min(frames, lo + size)
        spans.append((lo, hi))
        lo, size = hi, min(size * GROWTH, max(most, first))
    return spans


class StreamingSession:
    """One voice's two onnxruntime sessions (front and decoder), serving one call at a time.

    ``speak`` hands out audio window by window; the audio is scaled by ``gain`` and clipped to
    [-1, 1] (a sentence cannot be peak-normalized before its end is made)."""

    def __init__(
        self, split: SplitVoice, make_session, make_decoder=None, quantum: int = 0
    ) -> None:
        """``make_session(model_bytes)``: an onnxruntime InferenceSession with the caller's
        options, for the front; ``make_decoder``: the same for the decoder (default:
        ``make_session``; PiperTts gives it the CUDA provider there); ``quantum``: see :func:`fit`."""
        self.split = split
        self.front = make_session(split.front)
        self.decoder = (make_decoder or make_session)(split.decoder)
        self.quantum = quantum

    def latent(self, args: dict) -> np.ndarray:
        """The front's output for Piper's input dict (input, input_lengths, scales[, sid]):
        float32 [1, channels, frames]."""
        return self.front.run([self.split.latent], args)[0]

    def decode(self, z: np.ndarray, lo: int, hi: int, sid) -> np.ndarray:
        """Audio of frames [lo, hi) of ``z`` [1, C, T], decoded with PAD_FRAMES of context each
        side: float32 [(hi - lo) * hop]."""
        frames = z.shape[2]
        left, right = fit(
            max(0, lo - PAD_FRAMES), min(frames, hi + PAD_FRAMES), frames, self.quantum
        )
        window = z[:, :, left:right]  # [1, C, <= right - left]
        if right > frames:  # a sentence shorter than the quantum's length: zeros after its end
            window = np.concatenate(
                [window, np.zeros((1, z.shape[1], right - frames), dtype=z.dtype)], axis=2
            )
        feed = {self.split.latent: np.ascontiguousarray(window)}
        if self.split.speaker:
            feed["sid"] = sid
        audio = self.decoder.run(None, feed)[0].reshape(-1)  # [(right - left) * hop]
        hop = audio.size // (right - left)  # samples a frame (256 for Piper's voices)
        return audio[(lo - left) * hop : (hi - left) * hop]

    def warm(self, z: np.ndarray, sid=None) -> None:
        """With a quantum: run the decoder once on every window length it can meet, frames of
        ``z`` (a sentence's latent, [1, C, T]) repeated to that length."""
        if self.quantum <= 0:
            return
        for frames in range(self.quantum, MOST_FRAMES + 2 * PAD_FRAMES + 1, self.quantum):
            tiled = np.concatenate([z] * -(-frames // z.shape[2]), axis=2)[:, :, :frames]
            self.decode(np.ascontiguousarray(tiled), 0, frames, sid)

    def speak(self, args: dict, first: int, gain: float, on_chunk) -> bool:
        """Speak one sentence (Piper's input dict): ``on_chunk(float32 audio)`` per window, the
        first of ``first`` frames. Returns False as soon as ``on_chunk`` does (the rest is not
        made)."""
        z = self.latent(args)
        sid = args.get("sid")
        for lo, hi in windows(z.shape[2], first):
            audio = np.clip(self.decode(z, lo, hi, sid) * gain, -1.0, 1.0).astype(np.float32)
            if not on_chunk(audio):
                return False
        return True
