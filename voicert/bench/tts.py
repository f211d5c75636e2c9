"""Speech out, voice against voice: ``python -m voicert.bench.tts``.

For each voice (eSpeak NG, Piper on the CPU, Piper on onnxruntime's CUDA provider when it is
there), over a set of agent replies (confirmations with names, numbers, dates and times):

- **first audio**: the reply's first piece (as the session cuts it: the first clause or sentence,
  ``speech/sentences.py``) handed to the voice, to its first chunk of audio; P50 / P95 over the set
  (each reply timed ``--repeat`` times, after a warm-up);
- **real-time factor**: synthesis time over audio duration, for whole replies;
- **longest stall**: played from its first chunk on as chunks arrive, how long a whole reply's
  audio would have run dry waiting for the next (0: synthesis kept ahead of playback);
- **intelligibility**: the reply synthesized piece by piece as the session cuts it (``--first-words``:
  ``tts.first_piece_words`` settings side by side), resampled to 16 kHz and transcribed by the embedded
  Whisper tiny.en; the word error rate of that transcript against the reply's text (the "round
  trip" WER, in percent). Whisper is weak on formant speech as on accents: a lower WER means a voice that is
  easier to understand, for this listener.

Prints one Markdown table (``--json`` for the rows).

Where Whisper is not installed (the lent GPU machine), ``--no-wer --save DIR`` times the voices and
writes each voice's spoken replies to ``DIR``; ``--wer-of DIR`` then gives their round-trip WER on
a machine that has it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import numpy as np

from voicert.audio.wav import read_wav, write_wav
from voicert.bench.asr_eval import wer, whisper_normalize
from voicert.speech.sentences import SentenceSplitter

REPLIES = [
    "Sure, I have booked a table for four at seven thirty tonight under the name Rivera.",
    "Your order is two large pepperoni pizzas, one garlic bread and a diet cola. Is that right?",
    "I have you down for Tuesday the fourteenth at ten in the morning with Doctor Patel.",
    "Your flight, British Airways two one seven, leaves Boston for London on March third.",
    "The transfer of two hundred and fifty dollars from checking to savings is done.",
    "We are open from eleven in the morning until ten at night, every day except Monday.",
    "The capital of France is Paris. Would you like to know anything else about it?",
    "I am sorry, the kitchen closes at nine. Would you like a table for tomorrow instead?",
    "Your package left the warehouse this morning and should arrive on Friday afternoon.",
    "Please hold on for a moment while I check the availability for Saturday evening.",
]


@dataclasses.dataclass
class Timing:
    first_ms: list[float]
    rtf: list[float]
    transcripts: list[str]
    stall_ms: list[float]  # per reply: how far its audio, played from its first chunk on, would
    # have run dry waiting for the next chunk (0: always ahead of playback)


def pieces_of(text: str, first_clause_chars: int = 24, first_words: int = 0) -> list[str]:
    """The pieces the session speaks ``text`` in, its words arriving one by one as tokens do."""
    splitter = SentenceSplitter(first_clause_chars, first_words)
    pieces = []
    for word in text.split(" "):
        pieces += splitter.push(word + " ")
    return pieces + splitter.flush()


def time_voice(voice, repeat: int, asr, first_words: int = 0, save: Path | None = None) -> Timing:
    """Time ``voice`` over REPLIES (after one warm-up call); transcribe each reply, spoken piece
    by piece as the session cuts it, with ``asr`` (None: no transcripts); with ``save``, write each
    reply's audio there as ``NN.wav`` (16 kHz)."""
    import soxr

    voice.synthesize("Warming up.", lambda c: True)
    firsts, rtfs, transcripts, stalls = [], [], [], []
    for text in REPLIES:
        pieces = pieces_of(text, first_words=first_words)
        piece = pieces[0]
        for _ in range(repeat):
            t0 = time.perf_counter_ns()
            seen = []

            def on_chunk(chunk, seen=seen, t0=t0) -> bool:
                seen.append(time.perf_counter_ns() - t0)
                return False  # the first chunk is all this measures

            voice.synthesize(piece, on_chunk)
            firsts.append(seen[0] / 1e6)
        chunks: list[np.ndarray] = []
        arrivals: list[float] = []
        t0 = time.perf_counter()
        for part in pieces:
            voice.synthesize(
                part,
                lambda c: (
                    arrivals.append(time.perf_counter())
                    or chunks.append(np.asarray(c, np.float32))
                    or True
                ),
            )
        took = time.perf_counter() - t0
        audio = np.concatenate(chunks)  # [N] at the voice's rate
        rtfs.append(took / (audio.size / voice.sample_rate))
        stalls.append(stall_ms(arrivals, [c.size for c in chunks], voice.sample_rate))
        audio16 = soxr.resample(audio, voice.sample_rate, 16000).astype(np.float32)
        if save is not None:
            write_wav(save / f"{len(rtfs) - 1:02d}.wav", audio16, 16000)
        if asr is not None:
            transcripts.append(transcribe(asr, audio16))
    return Timing(firsts, rtfs, transcripts, stalls)


def stall_ms(arrivals: list[float], sizes: list[int], rate: int) -> float:
    """The longest wait for audio of a listener who starts playing the first chunk when it
    arrives (``arrivals`` in seconds, ``sizes`` in samples): 0 when every chunk came before the
    audio before it had played out."""
    played, worst = arrivals[0], 0.0
    for arrived, size in zip(arrivals, sizes):
        worst = max(worst, arrived - played)
        played = max(played, arrived) + size / rate
    return worst * 1e3


def time_parallel(voice, callers: int, repeat: int, first_words: int) -> dict:
    """``callers`` threads at once, each speaking every reply's first piece ``repeat`` times (a
    busy server's TTS threads): first audio per piece (P50 / P95) and pieces a second overall."""
    import threading

    pieces = [pieces_of(text, first_words=first_words)[0] for text in REPLIES] * repeat
    firsts: list[float] = []
    lock = threading.Lock()

    def speak(mine: list[str]) -> None:
        for piece in mine:
            t0 = time.perf_counter_ns()
            seen: list[int] = []
            voice.synthesize(piece, lambda c: seen.append(time.perf_counter_ns() - t0) and False)
            with lock:
                firsts.append(seen[0] / 1e6)

    for warm in [
        threading.Thread(target=voice.synthesize, args=("Warming up.", lambda c: True))
        for _ in range(callers)
    ]:
        warm.start()
        warm.join()
    threads = [threading.Thread(target=speak, args=(pieces[i::callers],)) for i in range(callers)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    took = time.perf_counter() - t0
    return {
        "first_audio_p50_ms": pct(firsts, 50),
        "first_audio_p95_ms": pct(firsts, 95),
        "pieces_per_s": len(firsts) / took,
    }


def parallel(callers: int, ort_threads: int, repeat: int, first_words: int) -> int:
    """Piper on the CPU, ``callers`` threads speaking at once: one onnxruntime session that
    serves them in turn (``tts.sessions: 1``) against one session per thread, side by side."""
    from voicert.config import TtsConfig
    from voicert.speech.piper_voice import PiperTts

    print(
        f"Piper, {callers} threads speaking first pieces at once ({ort_threads or 'all'} "
        f"onnxruntime threads each, {len(REPLIES)} pieces x {repeat})\n"
    )
    print("| sessions | first audio P50 | P95 (ms) | pieces a second |")
    print("|---|---:|---:|---:|")
    for label, sessions in (("one, in turn", 1), ("one per thread", callers)):
        voice = PiperTts(
            TtsConfig(engine="piper", workers=callers, sessions=sessions, threads=ort_threads)
        )
        r = time_parallel(voice, callers, repeat, first_words)
        print(
            f"| {label} | {r['first_audio_p50_ms']:.1f} | {r['first_audio_p95_ms']:.1f} | "
            f"{r['pieces_per_s']:.1f} |",
            flush=True,
        )
    return 0


def transcribe(asr, audio16: np.ndarray) -> str:
    segments, _ = asr.transcribe(
        audio16,
        language="en",
        beam_size=1,
        temperature=0.0,
        vad_filter=False,
        condition_on_previous_text=False,
        without_timestamps=True,
    )
    return " ".join(s.text.strip() for s in segments)


def whisper():
    from faster_whisper import WhisperModel

    from voicert.speech.asr import resolve_asr_model

    return WhisperModel(str(resolve_asr_model("embedded")), device="cpu", compute_type="int8")


def wer_of(directory: Path) -> int:
    """Round-trip WER of replies saved by ``--save`` (one folder per voice row)."""
    asr = whisper()
    print("| voice (saved) | round-trip WER | same, Whisper-normalized |\n|---|---:|---:|")
    for folder in sorted(p for p in directory.iterdir() if p.is_dir()):
        wavs = sorted(folder.glob("*.wav"))
        heard = [transcribe(asr, read_wav(w)[0]) for w in wavs]
        print(
            f"| {folder.name} | {wer(list(zip(REPLIES, heard))):.1f} % ({len(wavs)} replies) "
            f"| {percent(normalized_wer(heard))} |"
        )
    return 0


def slug(label: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in label.lower()).strip("-")


def voices(which: list[str], stream_frames: int | None = None):
    """(label, voice) for each name asked for that loads here (``stream_frames``: Piper's
    ``tts.stream_frames`` where it streams; None: the config's default)."""
    from voicert.config import TtsConfig
    from voicert.speech.tts import EspeakVoice

    out = []
    for name in which:
        if name == "espeak":
            out.append(("eSpeak NG (formant)", EspeakVoice(TtsConfig(engine="espeak"))))
            continue
        from voicert.speech.piper_voice import PiperTts, cuda_available

        device = "cuda" if name == "piper-cuda" else "cpu"
        if device == "cuda" and not cuda_available():
            print(f"# {name}: onnxruntime has no CUDA provider here: skipped", file=sys.stderr)
            continue
        spin = name == "piper-spin"  # tts.spin: true
        whole = name == "piper-whole"  # tts.stream_frames: 0
        frames = 0 if whole else stream_frames
        voice = PiperTts(
            TtsConfig(
                engine="piper",
                device=device,
                spin=spin,
                **({} if frames is None else {"stream_frames": frames}),
            )
        )
        print(f"# {name}: onnxruntime providers {voice.providers()}", file=sys.stderr)
        how = "whole sentences" if whole else f"streamed, first {voice.stream_frames} frames"
        out.append(
            (f"Piper {voice.name} ({voice.device}, {how}{', spinning' if spin else ''})", voice)
        )
    return out


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m voicert.bench.tts",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "--voices",
        default="espeak,piper-whole,piper,piper-cuda",
        help="any of espeak, piper (streamed), piper-whole (tts.stream_frames: 0), "
        "piper-spin (tts.spin: true), piper-cuda",
    )
    ap.add_argument("--repeat", type=int, default=5, help="first-audio timings per reply")
    ap.add_argument("--threads", type=int, default=0, help="torch/ort threads hint (0: default)")
    ap.add_argument(
        "--first-words",
        default="0",
        help="tts.first_piece_words settings to compare, e.g. 0,6 (0: off)",
    )
    ap.add_argument(
        "--stream-frames",
        type=int,
        default=None,
        metavar="N",
        help="tts.stream_frames of the streamed Piper rows (default: the config's)",
    )
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--no-wer", action="store_true", help="no round trip (Whisper not needed)")
    ap.add_argument(
        "--save",
        type=Path,
        metavar="DIR",
        help="write each voice's spoken replies under DIR (16 kHz WAV)",
    )
    ap.add_argument(
        "--wer-of",
        type=Path,
        metavar="DIR",
        help="only: the round-trip WER of replies an earlier --save wrote",
    )
    ap.add_argument(
        "--parallel",
        type=int,
        default=0,
        metavar="N",
        help="only: Piper with N threads speaking at once, one onnxruntime session "
        "in turn against one per thread (with --ort-threads and --first-words)",
    )
    ap.add_argument(
        "--ort-threads",
        type=int,
        default=2,
        help="--parallel: onnxruntime threads per session (tts.threads; 0: all)",
    )
    args = ap.parse_args(argv)
    if args.parallel:
        return parallel(
            args.parallel, args.ort_threads, args.repeat, int(args.first_words.split(",")[0])
        )
    if args.wer_of is not None:
        if not args.wer_of.is_dir():
            ap.error(f"--wer-of: {args.wer_of} is not a folder of saved replies")
        return wer_of(args.wer_of)
    asr = None if args.no_wer else whisper()
    rows = []
    settings = [int(n) for n in args.first_words.split(",")]
    for (label, voice), words in (
        (v, n) for v in voices(args.voices.split(","), args.stream_frames) for n in settings
    ):
        if len(settings) > 1:
            label += f", first piece <= {words} words" if words else ", first piece: clause"
        save = None
        if args.save is not None:
            save = args.save / slug(label)
            save.mkdir(parents=True, exist_ok=True)
        t = time_voice(voice, args.repeat, asr, words, save)
        rows.append(
            {
                "voice": label,
                "sample_rate": voice.sample_rate,
                "first_audio_p50_ms": pct(t.first_ms, 50),
                "first_audio_p95_ms": pct(t.first_ms, 95),
                "rtf_mean": float(np.mean(t.rtf)),
                "rtf_max": float(np.max(t.rtf)),
                "stall_max_ms": float(np.max(t.stall_ms)),
                "wer": wer(list(zip(REPLIES, t.transcripts))) if asr else None,
                "wer_whisper_norm": normalized_wer(t.transcripts) if asr else None,
                "transcripts": t.transcripts,
            }
        )
        print(
            json.dumps({k: v for k, v in rows[-1].items() if k != "transcripts"}),
            file=sys.stderr,
            flush=True,
        )
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(
        f"Speech out over {len(REPLIES)} agent replies ({args.repeat} first-audio timings each)\n"
    )
    print(
        "| voice | rate | first audio P50 | P95 (ms) | real-time factor mean | max | "
        "longest stall | round-trip WER | same, Whisper-normalized |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['voice']} | {r['sample_rate']} | {r['first_audio_p50_ms']:.1f} | "
            f"{r['first_audio_p95_ms']:.1f} | {r['rtf_mean']:.3f} | {r['rtf_max']:.3f} | "
            f"{r['stall_max_ms']:.0f} ms | {percent(r['wer'])} | "
            f"{percent(r['wer_whisper_norm'])} |"
        )
    return 0


def percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} %"


def normalized_wer(transcripts: list[str]) -> float | None:
    """The round trip's WER under Whisper's English normalizer (digits and words for numbers
    count alike, "Dr." is "doctor"); None where the normalizer is not installed."""
    try:
        return wer(list(zip(REPLIES, transcripts)), whisper_normalize)
    except ImportError:
        return None


if __name__ == "__main__":
    sys.exit(main())
