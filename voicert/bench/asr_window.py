"""Whisper's encoder window and its padding: ``python -m voicert.bench.asr_window``.

The server's ASR worker decodes an utterance in one Whisper window (``voicert/speech/asr.py``):
the full 30 s window, or with ``asr.min_window_s`` a shorter one, the audio padded to
``max(min_window_s, its length + 1 s)``. On a CPU the encoder's cost grows with the window, so a
short window is the cheapest way to a faster transcript; this bench shows what it costs in words.
Each row decodes every clip one at a time on this machine, the same model for every row:

- **WER** over the 32 clips of ``tests/data/eval`` (voices, rates, noise, mu-law) and the 12
  complete questions of ``tests/data/turns``; and over the 12 "pause" utterances heard whole;
- **decode P50**: log-mel + encode + greedy generate, one clip at a time;
- **first halves held**: the 12 pause utterances cut at their pause (plus 160 ms of silence, as
  the early final decode hears them): how many transcripts the text cue
  (``speech/turn_text.continues``) reads as unfinished, which is what keeps a semantic turn open;
- **demo**: the README's question ("What is the capital of France?").

Padding: ``silence`` (what the server does: the log-mel of digital silence, as Whisper was
trained) or ``zero`` (faster-whisper's ``pad_or_trim``: zeros in the normalised log-mel)."""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass

import numpy as np

from voicert.audio.wav import read_wav
from voicert.bench import DATA
from voicert.bench.asr_eval import audio_16k, wer
from voicert.bench.asr_eval import load_set as load_eval_set
from voicert.bench.turns import load_set
from voicert.config import AsrConfig
from voicert.speech.asr import WINDOW_S, max_tokens, pad_mel, window_frames
from voicert.speech.turn_text import continues

EARLY_S = 0.16  # the trailing silence the early final decode hears (asr.early_final_ms)


@dataclass(frozen=True, slots=True)
class PauseClip:
    whole: np.ndarray  # [N] float32 16 kHz: the utterance with its pause
    first: np.ndarray  # [M]: up to the pause, then EARLY_S of silence
    text: str  # the whole utterance's words


def pause_start(audio: np.ndarray, tail_s: float = 0.5) -> int:
    """Sample index where the longest quiet stretch (10 ms frames under -40 dBFS RMS) that ends
    more than ``tail_s`` before the clip's end begins: the pause inside an utterance."""
    frames = audio[: audio.size // 160 * 160].reshape(-1, 160)  # [F, 160]
    quiet = np.sqrt((frames**2).mean(axis=1)) < 0.01
    best, run, end = 0, 0, 0
    for i, q in enumerate(quiet):
        run = run + 1 if q else 0
        if run > best and i * 160 < audio.size - tail_s * 16000:
            best, end = run, i
    return (end - best + 1) * 160


def load_turns() -> tuple[list[tuple[np.ndarray, str]], list[PauseClip]]:
    """The complete questions (audio, text) and the pause utterances of tests/data/turns."""
    complete, pauses = [], []
    for u in load_set():
        if u.kind not in ("complete", "pause"):
            continue
        audio, rate = read_wav(u.path)
        assert rate == 16000, rate
        if u.kind == "complete":
            complete.append((audio, u.text))
            continue
        cut = pause_start(audio)
        first = np.concatenate([audio[:cut], np.zeros(int(EARLY_S * 16000), np.float32)])
        pauses.append(PauseClip(audio, first, u.text.replace("|", " ")))
    return complete, pauses


class Decoder:
    """Whisper tiny.en (the server's model and settings) with a chosen window and padding."""

    def __init__(self, model_spec: str = "embedded") -> None:
        from voicert.speech.asr import WhisperAsr

        self.asr = WhisperAsr(AsrConfig(), model_spec)
        self.asr.warmup()

    def text(self, audio: np.ndarray, window_s: float, pad: str) -> tuple[str, float]:
        """The transcript and the decode's milliseconds."""
        asr, model = self.asr, self.asr.model
        t0 = time.perf_counter_ns()
        mel = model.feature_extractor(audio[: int(WINDOW_S * 16000)])[..., :-1]  # [80, frames]
        width = window_frames(mel.shape[-1], AsrConfig(min_window_s=window_s))
        if pad == "silence":
            feats = pad_mel(mel, width)
        else:
            feats = np.pad(mel, ((0, 0), (0, max(0, width - mel.shape[-1]))))[:, :width]
        enc = model.encode(feats[None].astype(np.float32))  # [1, width / 2, d]
        res = model.model.generate(
            enc,
            [asr.prompt],
            beam_size=1,
            max_length=max_tokens(audio.size / 16000, len(asr.prompt)),
            suppress_blank=True,
            suppress_tokens=asr.suppress,
        )[0]
        ms = (time.perf_counter_ns() - t0) / 1e6
        tokens = [t for t in res.sequences_ids[0] if t < asr.tokenizer.eot]
        return asr.tokenizer.decode(tokens).strip(), ms

    def close(self) -> None:
        self.asr.close()


def row(
    dec: Decoder,
    window_s: float,
    pad: str,
    clips: list[tuple[np.ndarray, str]],
    pauses: list[PauseClip],
    demo: np.ndarray,
) -> dict:
    times, pairs = [], []
    for audio, ref in clips:
        text, ms = dec.text(audio, window_s, pad)
        pairs.append((ref, text))
        times.append(ms)
    halves = [dec.text(p.first, window_s, pad)[0] for p in pauses]
    whole = [(p.text, dec.text(p.whole, window_s, pad)[0]) for p in pauses]
    return {
        "window_s": window_s,
        "pad": pad,
        "wer": wer(pairs),
        "pause_wer": wer(whole),
        "decode_p50": statistics.median(times),
        "held": sum(continues(h) for h in halves),
        "halves": halves,
        "demo": dec.text(demo, window_s, pad)[0],
        "clips": len(pairs),
    }


def markdown(rows: list[dict], pauses: int) -> str:
    out = [
        "| window | padding | WER, eval + complete questions | WER, pause utterances whole | "
        "decode P50 | first halves held by the text cue | the demo question heard as |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        out.append(
            f"| {r['window_s']:g} s | {r['pad']} | {r['wer']:.1f} % ({r['clips']} clips) | "
            f"{r['pause_wer']:.1f} % | {r['decode_p50']:.0f} ms | {r['held']} / {pauses} | "
            f"{r['demo']} |"
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m voicert.bench.asr_window",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "--windows", default="30,8", help="encoder windows in seconds (30 = as trained)"
    )
    ap.add_argument("--pads", default="silence,zero", help="silence (the server's) and/or zero")
    ap.add_argument("--asr", default="embedded", help="a CTranslate2 Whisper dir")
    ap.add_argument("--halves", action="store_true", help="print each row's first-half transcripts")
    args = ap.parse_args(argv)
    try:
        windows = [float(w) for w in args.windows.split(",") if w]
    except ValueError:
        ap.error(f"--windows: {args.windows!r} is not a list of seconds")
    if not windows or any(not 1 <= w <= WINDOW_S for w in windows):
        ap.error(f"--windows: each window must be 1-{WINDOW_S:g} s")
    pads = [p for p in args.pads.split(",") if p]
    if bad := [p for p in pads if p not in ("silence", "zero")]:
        ap.error(f"--pads: {bad[0]!r} is not silence or zero")
    complete, pauses = load_turns()
    clips = [(audio_16k(u.path), u.text) for u in load_eval_set()] + complete
    demo = read_wav(DATA / "capital_of_france.wav")[0]
    dec = Decoder(args.asr)
    rows = []
    try:
        for pad in pads:
            for w in windows:
                rows.append(row(dec, w, pad, clips, pauses, demo))
                print(f"window {w:g} s, {pad}: done", file=sys.stderr, flush=True)
    finally:
        dec.close()
    print(markdown(rows, len(pauses)))
    if args.halves:
        for r in rows:
            print(f"{r['window_s']:g} s {r['pad']}: {r['halves']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
