"""Where Piper's time goes on onnxruntime's CUDA provider: the same sentence again and again (one
shape) against sentences of new lengths, under provider options."""

import json
import statistics
import time

import onnxruntime as ort
from piper import PiperVoice, SynthesisConfig
from piper.config import PiperConfig

from voicert.speech.piper_voice import embedded_voice

model, config = embedded_voice()
cfg = PiperConfig.from_dict(json.loads(config.read_text()))
texts = [
    "Sure, I have booked a table",
    "Your order is two large",
    "I have you down for Tuesday",
    "Your flight leaves Boston",
    "The transfer is done",
    "We are open from eleven",
    "The capital of France is Paris",
    "I am sorry, the kitchen closes",
    "Your package left",
    "Please hold on for a moment",
]


def first_chunk(voice, text):
    t0 = time.perf_counter_ns()
    for _chunk in voice.synthesize(text, SynthesisConfig()):
        return (time.perf_counter_ns() - t0) / 1e6


variants = {
    "cpu": ["CPUExecutionProvider"],
    "cuda heuristic (ours)": [("CUDAExecutionProvider", {"cudnn_conv_algo_search": "HEURISTIC"})],
    "cuda exhaustive": [("CUDAExecutionProvider", {"cudnn_conv_algo_search": "EXHAUSTIVE"})],
    "cuda default, copy in default stream off": [
        (
            "CUDAExecutionProvider",
            {"cudnn_conv_algo_search": "DEFAULT", "do_copy_in_default_stream": "0"},
        )
    ],
}
for name, providers in variants.items():
    opts = ort.SessionOptions()
    sess = ort.InferenceSession(str(model), sess_options=opts, providers=providers)
    voice = PiperVoice(config=cfg, session=sess)
    first_chunk(voice, "Warming up.")
    same = [first_chunk(voice, texts[0]) for _ in range(10)]
    new = [first_chunk(voice, t) for t in texts[1:]]
    again = [first_chunk(voice, t) for t in texts[1:]]
    print(
        f"{name:42s} same sentence x10 P50 {statistics.median(same):6.1f} ms | nine new sentences P50 {statistics.median(new):6.1f} ms | the nine again P50 {statistics.median(again):6.1f} ms",
        flush=True,
    )
