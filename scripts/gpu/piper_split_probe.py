"""Piper split at its decoder (speech/piper_stream.py): the decoder on onnxruntime's CPU and CUDA
providers, windows of fixed sizes against windows of each sentence's own size. The front runs on
the CPU (its shapes change with every sentence and every noise draw).

    python3 scripts/gpu/piper_split_probe.py        # prints one table (GPU box: onnxruntime-gpu)
"""

import statistics
import sys
import time

import numpy as np
import onnxruntime as ort
from piper import SynthesisConfig

from voicert.config import TtsConfig
from voicert.speech.piper_stream import PAD_FRAMES, split_voice
from voicert.speech.piper_voice import Speaker, embedded_voice, synthesis_config

TEXTS = [
    "Sure, I have booked a table for four at seven thirty tonight under the name Rivera.",
    "Your order is two large pepperoni pizzas, one garlic bread and a diet cola.",
    "I have you down for Tuesday the fourteenth at ten in the morning with Doctor Patel.",
    "Your flight leaves Boston for London on March third.",
    "The transfer of two hundred and fifty dollars from checking to savings is done.",
    "We are open from eleven in the morning until ten at night, every day except Monday.",
    "The capital of France is Paris.",
    "I am sorry, the kitchen closes at nine.",
    "Your package left the warehouse this morning.",
    "Please hold on for a moment.",
]


def main() -> int:
    model, config = embedded_voice()
    split = split_voice(model)
    cpu = Speaker(model, config, split, False, 0, False)
    syn = synthesis_config(cpu.piper.config, TtsConfig(), SynthesisConfig)
    latents = []
    for _ in range(3):
        for text in TEXTS:
            for phonemes in cpu.piper.phonemize(text):
                latents.append(cpu.stream.latent(cpu.inputs(phonemes, syn)))
    print(
        f"# {len(latents)} sentences' latents, frames P50 "
        f"{statistics.median(z.shape[2] for z in latents)}; providers {ort.get_available_providers()}"
    )
    decoders = {"cpu (all cores)": ["CPUExecutionProvider"]}
    if "CUDAExecutionProvider" in ort.get_available_providers():
        decoders["cuda heuristic"] = [
            ("CUDAExecutionProvider", {"cudnn_conv_algo_search": "HEURISTIC"})
        ]
        decoders["cuda default"] = [
            ("CUDAExecutionProvider", {"cudnn_conv_algo_search": "DEFAULT"})
        ]
    print(
        "| decoder | first window, 16 + 16 frames (fixed) | 64 + 32 frames (fixed) | 256 + 32 (fixed) "
        "| whole sentence (own size) |"
    )
    print("|---|---:|---:|---:|---:|")
    for name, providers in decoders.items():
        session = ort.InferenceSession(split.decoder, providers=providers)
        print(f"# {name}: runs on {session.get_providers()}", file=sys.stderr)

        def run(z):
            t0 = time.perf_counter_ns()
            session.run(None, {split.latent: np.ascontiguousarray(z)})
            return (time.perf_counter_ns() - t0) / 1e6

        cols = []
        for frames in (16 + PAD_FRAMES, 64 + 2 * PAD_FRAMES, 256 + 2 * PAD_FRAMES):
            fixed = [z[:, :, :frames] for z in latents if z.shape[2] >= frames]
            for z in fixed[:3]:
                run(z)  # warm this shape
            cols.append(statistics.median(run(z) for z in fixed) if fixed else float("nan"))
        for z in latents[:3]:
            run(z)
        cols.append(statistics.median(run(z) for z in latents))
        print(f"| {name} | " + " | ".join(f"{c:.1f} ms" for c in cols) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
