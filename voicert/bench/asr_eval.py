"""ASR accuracy: ``python -m voicert.bench.asr_eval``.

Word error rate of the streaming path (each utterance streamed to a voicert server over the native
protocol, in its own encoding and rate: 8 kHz mu-law files go as ``mulaw``, the rest as 16 kHz
pcm16; the transcript is the server's ``transcript.final``) beside a plain offline faster-whisper
``transcribe()`` of the same audio, on the evaluation set in ``tests/data/eval`` (32 espeak-ng
utterances: several voices and speeds, white noise at 10 dB SNR, 8 kHz mu-law)."""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from websockets.asyncio.client import connect

from voicert.audio.pcm import encode_pcm16
from voicert.audio.wav import read_g711, read_wav
from voicert.bench import DATA
from voicert.protocol import native as p

EVAL_DIR = DATA / "eval"
_NUMBERS = {
    "0": "zero",
    "1": "one",
    "2": "two",
    "3": "three",
    "4": "four",
    "5": "five",
    "6": "six",
    "7": "seven",
    "8": "eight",
    "9": "nine",
    "10": "ten",
    "11": "eleven",
    "12": "twelve",
}


def normalize(text: str) -> list[str]:
    """Lower case, no punctuation, small numbers spelled out."""
    words = re.sub(r"[^a-z0-9' ]+", " ", text.lower()).split()
    return [_NUMBERS.get(w, w) for w in words]


def whisper_normalize(text: str) -> list[str]:
    """OpenAI Whisper's English text normalizer (the ``whisper-normalizer`` package, MIT), as ASR
    papers and leaderboards score: numbers as digits ("fourteenth" and "14th" alike), "Dr." as
    "doctor", British spellings as American. Raises ImportError where it is not installed (the
    ``test`` extra has it)."""
    from whisper_normalizer.english import EnglishTextNormalizer

    return EnglishTextNormalizer()(text).split()


def edit_distance(ref: list[str], hyp: list[str]) -> int:
    """Word-level Levenshtein distance (substitutions + deletions + insertions)."""
    prev = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        cur = [i]
        for j, h in enumerate(hyp, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (r != h)))
        prev = cur
    return prev[-1]


def wer(pairs: list[tuple[str, str]], norm=normalize) -> float:
    """Corpus WER in percent over (reference, hypothesis) pairs, both normalized by ``norm``
    (:func:`normalize`, or :func:`whisper_normalize`)."""
    errors = sum(edit_distance(norm(r), norm(h)) for r, h in pairs)
    words = sum(len(norm(r)) for r, _ in pairs)
    return 100.0 * errors / max(words, 1)


@dataclass
class Utterance:
    id: str
    condition: str
    text: str
    path: Path


def load_set(directory: Path = EVAL_DIR) -> list[Utterance]:
    with open(directory / "sentences.tsv", newline="") as f:
        rows = list(csv.reader(f, delimiter="\t"))
    return [Utterance(r[0], r[3], r[4], directory / f"{r[0]}.wav") for r in rows]


def audio_16k(path: Path) -> np.ndarray:
    import soxr

    x, rate = read_wav(path)
    return x if rate == 16000 else soxr.resample(x, rate, 16000).astype(np.float32)


async def stream_one(url: str, utt: Utterance, timeout: float = 60.0) -> str:
    """The server's final transcript of one utterance, sent as a caller would send it."""
    g711 = read_g711(utt.path)
    if g711 is not None:
        speech, encoding, rate, _ = g711
        step = rate // 50  # 20 ms, one byte a sample
        silence = (b"\xff" if encoding == "mulaw" else b"\xd5") * rate  # 1 s of G.711 silence
    else:
        x, rate = read_wav(utt.path)
        encoding = "pcm16"
        speech, silence = encode_pcm16(x), bytes(2 * rate)
        step = rate // 50 * 2
    async with connect(url) as ws:
        await ws.send(
            p.encode(p.SessionStart(sample_rate=rate, encoding=encoding, max_new_tokens=1))
        )
        # speech as fast as it goes, the trailing second of silence at real-time pace: the
        # endpointing then runs as in a live call (the early final decode has time to start)
        for i in range(0, len(speech), step):
            await ws.send(p.encode(p.Audio(speech[i : i + step])))
        for i in range(0, len(silence), step):
            await ws.send(p.encode(p.Audio(silence[i : i + step])))
            await asyncio.sleep(0.02)
        while True:
            ev = p.decode_server(await asyncio.wait_for(ws.recv(), timeout))
            if ev["type"] == "transcript.final":
                return ev["text"]
            if ev["type"] == "error":
                raise RuntimeError(f"{utt.id}: {ev}")


def offline(model, utt: Utterance) -> str:
    segments, _ = model.transcribe(
        audio_16k(utt.path),
        language="en",
        beam_size=1,
        temperature=0.0,
        vad_filter=False,
        condition_on_previous_text=False,
        without_timestamps=True,
    )
    return " ".join(s.text.strip() for s in segments)


async def evaluate(url: str, model, utts: list[Utterance], callers: int = 4) -> dict:
    """Each utterance streamed through the server at ``url`` (``callers`` of them at a time, as
    concurrent callers would) and decoded offline by ``model``; WER per condition and overall."""
    gate = asyncio.Semaphore(max(1, callers))

    async def streamed(u: Utterance) -> str:
        async with gate:
            return await stream_one(url, u)

    streaming = await asyncio.gather(*(streamed(u) for u in utts))
    rows = []
    for u, text in zip(utts, streaming):
        rows.append(
            {
                "id": u.id,
                "condition": u.condition,
                "reference": u.text,
                "streaming": text,
                "offline": await asyncio.to_thread(offline, model, u),
            }
        )
    conditions = sorted({r["condition"] for r in rows})
    table = {}
    for cond in [*conditions, "all"]:
        sel = [r for r in rows if cond in ("all", r["condition"])]
        live = [(r["reference"], r["streaming"]) for r in sel]
        whole = [(r["reference"], r["offline"]) for r in sel]
        table[cond] = {"n": len(sel), "streaming_wer": wer(live), "offline_wer": wer(whole)}
        try:  # as ASR papers count (numbers as digits on both sides); where installed
            table[cond] |= {
                "streaming_wer_whisper_norm": wer(live, whisper_normalize),
                "offline_wer_whisper_norm": wer(whole, whisper_normalize),
            }
        except ImportError:
            pass
    return {"rows": rows, "wer": table}


def markdown(result: dict) -> str:
    lines = [
        "| condition | utterances | streaming WER % | offline WER % | difference | "
        "streaming / offline, Whisper-normalized |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for cond, w in result["wer"].items():
        norm = (
            f"{w['streaming_wer_whisper_norm']:.1f} / {w['offline_wer_whisper_norm']:.1f}"
            if "offline_wer_whisper_norm" in w
            else "-"
        )
        lines.append(
            f"| {cond} | {w['n']} | {w['streaming_wer']:.1f} | {w['offline_wer']:.1f} | "
            f"{w['streaming_wer'] - w['offline_wer']:+.1f} | {norm} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m voicert.bench.asr_eval", description=__doc__)
    ap.add_argument("--url", default="ws://127.0.0.1:8765/v1/stream")
    ap.add_argument("--asr", default="embedded", help="the model the offline baseline uses")
    ap.add_argument("--callers", type=int, default=4, help="utterances streamed at a time")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    from faster_whisper import WhisperModel

    from voicert.speech.asr import resolve_asr_model

    model = WhisperModel(str(resolve_asr_model(args.asr)), device="cpu", compute_type="int8")
    result = asyncio.run(evaluate(args.url, model, load_set(), args.callers))
    print(markdown(result))
    for r in result["rows"]:
        if normalize(r["streaming"]) != normalize(r["reference"]):
            print(
                f"{r['id']} [{r['condition']}] ref: {r['reference']!r} stream: {r['streaming']!r}"
            )
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
