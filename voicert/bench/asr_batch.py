"""Cross-session ASR batching: ``python -m voicert.bench.asr_batch --device cuda``.

N sessions finish an utterance at the same moment. voicert: every utterance goes to the one ASR
worker (batch window, batched CTranslate2 encode + generate); latency = submit -> transcript.
Baseline, side by side: one faster-whisper ``transcribe()`` per session at once (N threads, one model
with N workers, temperature 0, same token limit). ``--model whisper-base-random`` /
``whisper-small-random`` build random-weight models of those shapes (timing only, labelled)."""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from voicert.audio.wav import read_wav
from voicert.bench import DATA
from voicert.config import AsrConfig
from voicert.core.speech import FINAL
from voicert.speech.asr import WhisperAsr, embedded_whisper_dir, resolve_asr_model

CLIPS = sorted(str(p) for p in DATA.glob("*.wav"))
SHAPES = {  # English-only Whisper shapes (same vocabulary as tiny.en)
    "whisper-base-random": dict(
        d_model=512,
        encoder_layers=6,
        decoder_layers=6,
        encoder_attention_heads=8,
        decoder_attention_heads=8,
        encoder_ffn_dim=2048,
        decoder_ffn_dim=2048,
    ),
    "whisper-small-random": dict(
        d_model=768,
        encoder_layers=12,
        decoder_layers=12,
        encoder_attention_heads=12,
        decoder_attention_heads=12,
        encoder_ffn_dim=3072,
        decoder_ffn_dim=3072,
    ),
}


def random_ct2_model(name: str, out: Path, tokenizer_dir: Path) -> Path:
    """A random-weight Whisper of a real shape, converted to CTranslate2 (tiny.en's tokenizer)."""
    import ctranslate2
    import torch
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    tiny = tokenizer_dir
    cfg = WhisperConfig(
        vocab_size=51864,
        num_mel_bins=80,
        max_source_positions=1500,
        max_target_positions=448,
        decoder_start_token_id=50257,
        eos_token_id=50256,
        pad_token_id=50256,
        bos_token_id=50256,
        **SHAPES[name],
    )
    torch.manual_seed(0)
    hf_dir = out / "hf"
    WhisperForConditionalGeneration(cfg).save_pretrained(hf_dir)
    shutil.copy(tiny / "tokenizer.json", hf_dir / "tokenizer.json")
    ct2_dir = out / "ct2"
    ctranslate2.converters.TransformersConverter(
        str(hf_dir), copy_files=["tokenizer.json"]
    ).convert(str(ct2_dir), quantization="float16", force=True)
    return ct2_dir


def pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs), q))


async def ours(asr: WhisperAsr, audios: list[np.ndarray], n: int, rounds: int) -> list[float]:
    out: list[float] = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        handles = [asr.submit(audios[i % len(audios)], FINAL) for i in range(n)]
        for h in handles:
            h.future.add_done_callback(
                lambda _f, t0=t0: out.append((time.perf_counter() - t0) * 1e3)
            )
        await asyncio.gather(*(h.future for h in handles))
    return out


def baseline(model_dir: str, device: str, compute: str, audios, n: int, rounds: int) -> list[float]:
    from faster_whisper import WhisperModel

    model = WhisperModel(model_dir, device=device, compute_type=compute, num_workers=n)

    def one(i: int, t0: float) -> float:
        segments, _ = model.transcribe(
            audios[i % len(audios)],
            language="en",
            beam_size=1,
            temperature=0.0,
            vad_filter=False,
            without_timestamps=True,
            condition_on_previous_text=False,
            max_new_tokens=224,
        )
        " ".join(s.text for s in segments)
        return (time.perf_counter() - t0) * 1e3

    one(0, time.perf_counter())
    out: list[float] = []
    with ThreadPoolExecutor(n) as pool:
        for _ in range(rounds):
            t0 = time.perf_counter()
            out += list(pool.map(lambda i: one(i, t0), range(n)))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m voicert.bench.asr_batch", description=__doc__)
    ap.add_argument(
        "--model", default="embedded", help="embedded | CT2 dir | " + " | ".join(SHAPES)
    )
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--compute-type", default=None)
    ap.add_argument("--sessions", default="1,16,64")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--batch-window-ms", type=float, default=2.0)
    ap.add_argument(
        "--tokenizer-dir",
        help="CT2 Whisper dir whose tokenizer.json random models use "
        "(default: the embedded tiny.en)",
    )
    args = ap.parse_args(argv)
    compute = args.compute_type or ("float16" if args.device == "cuda" else "int8")
    tmp = None
    if args.model in SHAPES:
        tmp = Path(tempfile.mkdtemp(prefix="voicert-whisper-"))
        tok = Path(args.tokenizer_dir) if args.tokenizer_dir else embedded_whisper_dir()
        model_dir = str(random_ct2_model(args.model, tmp, tok))
        label = f"{args.model} (RANDOM WEIGHTS)"
    else:
        model_dir, label = str(resolve_asr_model(args.model)), f"{args.model} ({compute})"
    audios = [read_wav(c)[0] for c in CLIPS]
    levels = [int(s) for s in args.sessions.split(",")]
    asr = WhisperAsr(
        AsrConfig(
            device=args.device,
            compute_type=compute,
            batch_window_ms=args.batch_window_ms,
            max_batch=max(levels),
        ),
        model_dir,
    )
    asr.warmup()
    print(f"model: {label}; device {args.device}; {args.rounds} rounds")
    print(
        "| sessions | voicert batched P50 ms | P99 ms | per-session transcribe() P50 ms | P99 ms "
        "| P50 ratio |"
    )
    print("|---:|---:|---:|---:|---:|---:|")
    for n in levels:
        a = asyncio.run(ours(asr, audios, n, args.rounds))
        b = baseline(model_dir, args.device, compute, audios, n, args.rounds)
        print(
            f"| {n} | {pct(a, 50):.1f} | {pct(a, 99):.1f} | {pct(b, 50):.1f} | {pct(b, 99):.1f} "
            f"| {pct(b, 50) / pct(a, 50):.1f}x |",
            flush=True,
        )
    sizes = asr.drain_batch_sizes()
    print(f"batch sizes seen by the worker: max {max(sizes)}, mean {sum(sizes) / len(sizes):.1f}")
    asr.close()
    if tmp:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
