"""Train the pause head (voicert/speech/smart_turn.py PauseHead) on smart-turn v3's encoder.

    pip install --no-deps chatterbot-corpus   # BSD; training text only, never a dependency
    apt-get install espeak-ng                 # the second voice family
    python scripts/train_pause_head.py --out voicert/speech/data/smart-turn-v3.2-pause-head.json

smart-turn was trained on turn ends against speech cut off mid-turn; it never heard a speaker
*pause* mid-turn and then go on, and on the end-of-turn set's pauses it tells them apart little
better than chance (AUC 0.57-0.61, docs/benchmarks.md 36). This trains a logistic regression on
the same forward pass for exactly that:

1. Text: chatterbot-corpus's English lines (3-30 words), none of the end-of-turn set's
   sentences. Each line is paused once at a random word; the words before the pause are also
   spoken alone, as a whole turn, so a pause and a turn's end of the same words and length
   differ only in prosody (without them the head learns that short audio is unfinished).
2. Speech: each line by Piper's joe voice (the whole line in one synthesis, the pause cut into
   the word gap, as bench/turn_set.py renders the set) and by a random eSpeak NG voice (an SSML
   break), a random pause of 0.3-1.2 s, in a random condition (clean twice as often as pink
   noise at 15 dB or an 8 kHz mu-law line; the noise goes on through the silences).
3. Pauses as the endpointer finds them (Silero VAD): each judged at 128 or 192 ms of silence
   (the GPU and the CPU configs), labelled by whether the speaker went on. The features are
   the graph's attention-pooled state and the mean of its last 12 frames (768 values).
4. An L2-regularised logistic regression on the standardised features (Newton steps), folded
   back onto the raw features. Reported: AUC 5-fold by line, per voice and condition, beside
   smart-turn's own on the same pauses; with ``--renderings R --signals S`` (an eot bench run),
   AUC over that set's judged pauses as well.
Seeded. ``--features F`` keeps the rendered features, so another ``--l2`` refits in seconds.
About 25 minutes on 2 CPU cores for the whole corpus.
"""

from __future__ import annotations

import argparse
import random
import re
import time
from pathlib import Path

import numpy as np
from corpus import corpus_lines

from voicert.bench import turn_set as ts
from voicert.bench.eot import auc, heard_pauses, load, logistic, rejudge_audio, up_to
from voicert.config import load_config
from voicert.speech import smart_turn as st
from voicert.speech.vad import SileroVad

JUDGE_MS = (128, 192)
CONDITIONS = ("clean", "clean", "noisy", "phone")
VOICES = ("piper", "espeak")


def words_of(text: str) -> tuple[str, ...]:
    return tuple(re.sub(r"[^a-z0-9 ]", " ", text.lower()).split())


def training_lines(rng: random.Random, limit: int) -> list[str]:
    """Corpus lines of at least two words, none of them a sentence of the eval set, shuffled."""
    evaluated = {words_of(i.text.replace("|", " ")) for i in ts.ITEMS}
    lines = [ln for ln in corpus_lines(3) if words_of(ln) not in evaluated]
    rng.shuffle(lines)
    return lines[:limit] if limit else lines


def spoken(line: str, n: int, rng: random.Random) -> list[ts.Rendering]:
    """``line`` paused once at a random word, and the words before that pause spoken alone as a
    whole turn: each by Piper and by an eSpeak voice (when installed). The pause and the prefix's
    end share their words and their length, and differ in the voice's prosody alone (going on,
    against done), so that is what the head must learn, not how long the caller has spoken."""
    words = line.split()
    cut = rng.randint(1, len(words) - 1)
    paused = " ".join(words[:cut]) + " | " + " ".join(words[cut:])
    pause = rng.choice(ts.PAUSES_MS)
    scale = rng.choice(ts.PIPER_SCALES)
    voice, wpm = rng.choice(ts.ESPEAK_VOICES)
    wpm += rng.randint(-15, 15)
    out = []
    for kind, text in (("paused", paused), ("prefix", " ".join(words[:cut]))):
        item = ts.Item(f"t{n}{kind[0]}", "pause", "corpus", text)
        voices = []
        try:
            voices.append(("piper", ts._piper(text, scale, pause)))
        except IndexError:  # Piper's alignment has fewer word gaps than the text ("-" and such)
            pass
        if ts.espeak_available():
            voices.append(("espeak", ts._espeak(text, voice, wpm, pause)))
        for k, (name, clean) in enumerate(voices):
            condition = rng.choice(CONDITIONS)
            audio, noise = ts._condition(clean, condition, seed=n * 7 + k)
            rid = f"{item.id}-{name}-{condition}"
            end = ts.voiced_end(audio)
            out.append(ts.Rendering(rid, item, name, pause, condition, audio, end, noise))
    return out


class Encoder:
    """smart-turn's own P(complete) and the head's features, in batches."""

    def __init__(self) -> None:
        self.path = st.model_path()
        self._run = st._onnx_graph(self.path, 2, [st.LOGITS, st.POOLED, st.FRAMES])
        self._mel = st.mel_extractor()

    def __call__(self, audios: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        own, feats = [], []
        for i in range(0, len(audios), 16):
            batch = np.stack([st.features(a, self._mel) for a in audios[i : i + 16]])
            p, pooled, frames = self._run(batch)
            own.append(p.reshape(-1))
            feats.append(st.pause_features(pooled, frames))
        return np.concatenate(own), np.concatenate(feats)


def render_features(lines: list[str], rng: random.Random, enc: Encoder) -> dict[str, np.ndarray]:
    """Every judged pause of every line's renderings: features x, smart-turn's own p, label y
    (1: the turn's end), line g, voice v, condition c."""
    vad, vad_cfg = SileroVad(), load_config(None).vad
    audios, y, g, v, c = [], [], [], [], []
    t0 = time.perf_counter()
    for n, line in enumerate(lines):
        for r in spoken(line, n, rng):
            judge = rng.choice(JUDGE_MS)
            x, pauses = heard_pauses(vad, vad_cfg, r)
            for p in pauses:
                if p.length_ms >= judge:
                    audios.append(up_to(x, p.start_ms + judge))
                    y.append(float(p.final)), g.append(n), v.append(r.voice), c.append(r.condition)
        if n % 200 == 0:
            print(f"  {n}/{len(lines)} lines, {len(y)} pauses, {time.perf_counter() - t0:.0f} s")
    own, x = enc(audios)
    return dict(x=x, p=own, y=np.array(y), g=np.array(g), v=np.array(v), c=np.array(c))


def fit(x: np.ndarray, y: np.ndarray, l2: float) -> tuple[np.ndarray, float]:
    """(weight [d], bias) on the raw features."""
    mu, sd = x.mean(0), x.std(0) + 1e-6
    w = logistic(np.hstack([(x - mu) / sd, np.ones((len(x), 1))]), y, l2, steps=25)
    return w[:-1] / sd, float(w[-1] - (w[:-1] * mu / sd).sum())


def cross_validated(d: dict[str, np.ndarray], l2: float) -> np.ndarray:
    """Each pause's head logit from a fit on the other four fifths of the lines."""
    folds, out = d["g"] % 5, np.zeros(len(d["y"]))
    for k in range(5):
        w, b = fit(d["x"][folds != k], d["y"][folds != k], l2)
        out[folds == k] = d["x"][folds == k] @ w + b
    return out


def report(name: str, head: np.ndarray, own: np.ndarray, y: np.ndarray, groups: dict) -> None:
    print(f"{name}: {len(y)} pauses, {int(y.sum())} turn ends")
    print(f"  {'pauses':18s} {'head':>6s} {'smart-turn':>10s}")
    for label, m in [("all", np.ones(len(y), bool)), *groups.items()]:
        if m.any() and 0 < y[m].sum() < m.sum():
            print(f"  {label:18s} {auc(head[m], y[m]):6.3f} {auc(own[m], y[m]):10.3f}")


def eval_set(renderings: Path, signals: Path, judge_ms: int, head: st.PauseHead) -> None:
    """AUC over an eot run's judged pauses (judged at ``judge_ms``), the audio opinions judged
    again from its renderings."""
    scored = load(signals)
    for s in scored:
        for p in s.pauses:
            p.pause_prob = None
    model = st.SmartTurn(st.model_path(), 2, head=head)
    rejudge_audio(model, scored, ts.load_renderings(renderings), judge_ms)
    batch = {i.id: i.batch for i in ts.ITEMS}
    judged = [(s, p) for s in scored for p in s.pauses if p.pause_prob is not None]
    y = np.array([float(p.final) for _, p in judged])
    groups = {"first batch": np.array([batch[s.item] == 1 for s, _ in judged])}
    groups["held-out batch"] = ~groups["first batch"]
    groups.update({n: np.array([s.voice.startswith(n) for s, _ in judged]) for n in VOICES})
    groups.update(
        {n: np.array([s.condition == n for s, _ in judged]) for n in ("clean", "noisy", "phone")}
    )
    head_p = np.array([p.pause_prob for _, p in judged])
    own = np.array([p.audio_prob for _, p in judged])
    report(f"the eval set ({signals})", head_p, own, y, groups)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lines", type=int, default=0, help="corpus lines used (0: all)")
    ap.add_argument("--l2", type=float, default=100.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--features", type=Path, help="an .npz: read if it exists, else written")
    ap.add_argument("--renderings", type=Path, help="an eot run's renderings (with --signals)")
    ap.add_argument("--signals", type=Path, help="an eot run's signals: report AUC on the set")
    ap.add_argument("--judge-ms", type=int, default=192, help="the signals' turn.pause_ms")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    enc = Encoder()
    if args.features and args.features.exists():
        with np.load(args.features) as f:
            d = {k: f[k] for k in f.files}
    else:
        lines = training_lines(rng, args.lines)
        d = render_features(lines, rng, enc)
        if args.features:
            np.savez(args.features, **d)
    groups = {n: d["v"] == n for n in VOICES}
    groups.update({n: d["c"] == n for n in ("clean", "noisy", "phone")})
    report("corpus pauses, 5-fold by line", cross_validated(d, args.l2), d["p"], d["y"], groups)
    weight, bias = fit(d["x"], d["y"], args.l2)
    meta = {
        "data": f"chatterbot-corpus, {len(np.unique(d['g']))} lines, {len(d['y'])} pauses, "
        "Piper joe + eSpeak NG, clean / noisy / phone",
        "judged_at_ms": ",".join(map(str, JUDGE_MS)),
        "l2": str(args.l2),
        "seed": str(args.seed),
    }
    head = st.PauseHead(weight, bias, st.graph_digest(enc.path), meta)
    head.save(args.out)
    print(f"wrote {args.out}")
    if args.renderings and args.signals:
        eval_set(args.renderings, args.signals, args.judge_ms, head)


if __name__ == "__main__":
    main()
