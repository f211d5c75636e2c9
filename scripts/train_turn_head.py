"""Train the end-of-turn head (voicert/engine/core/turn_head.py) for the configured LLM.

    pip install --no-deps chatterbot-corpus   # BSD; training text only, never a dependency
    python scripts/train_turn_head.py --out voicert/engine/data/smollm2-135m-instruct-turn-head.safetensors

1. Text: the English lines of chatterbot-corpus (3-30 words, no markup; ``--min-words``). Each line gives
   examples: whole, as written and bare (complete); cut at a random word, bare and with the
   punctuation Whisper writes where audio stops (".", "?", "...", ","), incomplete.
2. Features: the engine's own final hidden state at the last token of the open user turn (the
   prompt a ``score_end`` request builds, under the configured system prompt), computed by the
   engine's model runner, so the head reads exactly what it will read when serving.
3. An L2-regularised logistic regression on the standardised features (Newton steps), folded
   back to one weight vector and a bias on the raw hidden state. With ``--balance``, examples
   are weighted so that complete and cut ones count the same at every length (cut prefixes are
   short by construction). Tried with ``--min-words 1``: on the eot set it did worse (hazard
   dead air at <= 10 % cut-offs 969 against 925 ms), so the shipped head is trained without.
   Tried with ``--numbers 400`` (numbers read in chunks): mixed, the CPU's digits cut off less
   and the GPU config's cut-offs rose (docs/benchmarks.md 51), so it is trained without too.
4. Reported: AUC on held-out lines (20 %, split by line), for the head and for the zero-shot
   P(end-of-message); with ``--signals`` (an eot bench signals file), AUC of "the turn ended
   here" over its judged pauses, from their early transcripts.
Seeded; about 8 minutes on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import re
import sys
import time
from importlib import resources
from pathlib import Path

import numpy as np
import torch
from corpus import corpus_lines

from voicert.bench.eot import auc, logistic
from voicert.config import cache_dir, load_config
from voicert.core.chat import ChatMessage
from voicert.engine.build import build_core
from voicert.engine.core.runner import ModelRunner, Row
from voicert.engine.loader import resolve_llm
from voicert.engine.settings import engine_config

ENDINGS = [".", ".", "?", "...", ","]  # what Whisper writes where the audio of a cut line stops


QUESTION_WORDS = (
    "what",
    "how",
    "is",
    "are",
    "when",
    "where",
    "which",
    "who",
    "do",
    "does",
    "can",
    "could",
    "will",
    "should",
    "did",
    "was",
    "were",
    "has",
    "have",
    "why",
)
AREAS = ["kitchen", "living room", "bedroom", "office", "garage", "bathroom", "hallway", "patio"]
NAMES = [
    "kitchen light",
    "front door",
    "desk lamp",
    "thermostat",
    "garage door",
    "ceiling fan",
    "TV",
]


def command_lines(per_intent: int, seed: int) -> list[str]:
    """Spoken commands and questions to a voice assistant: sentences sampled from
    home-assistant-intents' English templates (Apache-2.0) by hassil (Apache-2.0), at most
    ``per_intent`` per intent; slots filled from small lists, numbers in digits (as Whisper
    writes them), written as Whisper writes a whole utterance (capitalised, "." or "?")."""
    try:
        from hassil.intents import Intents, TextSlotList
        from hassil.sample import sample_intents

        data = resources.files("home_assistant_intents") / "data" / "en.json"
    except ModuleNotFoundError:
        sys.exit("commands: pip install --no-deps hassil home-assistant-intents unicode-rbnf")
    import json

    rng = random.Random(seed)
    lists = {
        "area": TextSlotList.from_strings(AREAS),
        "name": TextSlotList.from_strings(NAMES),
        "floor": TextSlotList.from_strings(["upstairs", "downstairs", "first floor"]),
    }
    intents = Intents.from_dict(json.loads(data.read_text()))
    raw = sample_intents(intents, lists, max_sentences_per_intent=per_intent, expand_ranges=False)
    out = set()
    for _, text in raw:
        text = re.sub(r"\{[a-z_]+\}", lambda _: str(rng.choice([2, 5, 10, 15, 20, 45, 70])), text)
        text = " ".join(text.split())
        if not text or re.search(r"[<>{}\[\]=_`]", text):
            continue
        end = "?" if text.split()[0].lower() in QUESTION_WORDS else "."
        out.add(text[0].upper() + text[1:] + end)
    return sorted(out)


NUMBERS = [  # (lead-ins, chunk sizes): identifiers callers read out in chunks, whole at the end
    (("My phone number is", "You can reach me at", "Call me at", "My cell is", "Text me at"),
     (3, 3, 4)),
    (("My card number is", "The card number is", "Charge it to", "The card is"), (4, 4, 4, 4)),
    (("My zip code is", "The zip is", "Ship it to zip code"), (2, 3)),
    (("My PIN is", "The pin code is"), (2, 2)),
    (("The order number is", "My tracking number is", "The reference is", "My member ID is"),
     (3, 3, 3)),
    (("The confirmation code is", "The booking code is"), (3, 3)),
]  # fmt: skip
NUMBER_SEPS = (("-", "-"), (" ", " "), (", ", "-"), (", ", " "))  # (between chunks, in a chunk)


def _chunk(digits: str, inner: str, rng: random.Random) -> str:
    """A chunk as Whisper writes digits read one by one: "555", "5-5-5" or "5 5 5"."""
    return rng.choice((digits, inner.join(digits)))


def number_examples(n: int, rng: random.Random) -> list[tuple[str, int]]:
    """(text, label) for ``n`` numbers read in chunks: the whole number (1: complete, with and
    without a final "."), and the same cut after a random earlier chunk (0: the caller paused
    mid-number; bare, or with the ".", "," or "..." Whisper writes there). No amounts, years or
    extensions (the end-of-turn set's held-out batch reads those)."""
    out = []
    for _ in range(n):
        leads, sizes = rng.choice(NUMBERS)
        between, inner = rng.choice(NUMBER_SEPS)
        chunks = ["".join(rng.choice("0123456789") for _ in range(k)) for k in sizes]
        words = [_chunk(c, inner if inner != " " else rng.choice(" -"), rng) for c in chunks]
        lead = rng.choice(leads)
        whole = f"{lead} {between.join(words)}"
        cut = f"{lead} {between.join(words[: rng.randint(1, len(words) - 1)])}"
        out += [(whole + ".", 1), (whole, 1), (cut, 0), (cut + rng.choice(ENDINGS), 0)]
    return out


def bare(text: str) -> str:
    return text.strip().rstrip(".?!,;:…-").rstrip()


def examples(lines: list[str], rng: random.Random) -> list[tuple[str, int]]:
    """(text, 1: complete / 0: cut) for each line: whole and bare; cut, bare and punctuated."""
    out = []
    for line in lines:
        words = line.split()
        out += [(line, 1), (bare(line), 1)]
        if len(words) > 1:
            cut = bare(" ".join(words[: rng.randint(1, len(words) - 1)]))
            out += [(cut, 0), (cut + rng.choice(ENDINGS), 0)]
    return [(t, y) for t, y in out if t.strip()]


@torch.inference_mode()
def last_hidden(core, system: str, text: str) -> tuple[np.ndarray, float]:
    """(final hidden state [hidden] at the open turn's last token, zero-shot P(end))."""
    runner: ModelRunner = core.runner
    msgs = [ChatMessage("system", system), ChatMessage("user", text)]
    ids, end_id = core.prompts.build_open(msgs, core.cfg.max_context_tokens, core.stop_ids)
    table = list(range(1, 1 + -(-len(ids) // runner.block_size)))  # block 0 is scratch
    x, inp = runner.prepare([Row(ids, 0, table, len(ids))])
    h = runner.forward(x, inp, runner.k_pool, runner.v_pool)[0, -1]  # [hidden]
    p = torch.softmax(runner.model.logits(h).float(), -1)[end_id].item()
    return h.float().cpu().numpy(), p


LENGTHS = (1, 2, 3, 4, 5, 6, 8, 11, 15)  # word-count buckets' lower edges


def balance(texts: list[str], y: np.ndarray) -> np.ndarray:
    """Example weights [n] (mean 1): in each word-count bucket, both classes weigh the same."""
    bucket = np.searchsorted(LENGTHS, [len(t.split()) for t in texts], side="right")
    w = np.zeros(len(y))
    for b in np.unique(bucket):
        for c in (0, 1):
            m = (bucket == b) & (y == c)
            if m.any() and ((bucket == b) & (y != c)).any():
                w[m] = 1.0 / m.sum()
    return w * len(y) / w.sum()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=None)
    ap.add_argument("--l2", type=float, default=100.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--min-words", type=int, default=3, help="shortest corpus line used")
    ap.add_argument("--balance", action="store_true", help="weigh classes equal per length")
    ap.add_argument("--signals", type=Path, help="an eot bench signals file: report its AUC")
    ap.add_argument(
        "--commands",
        type=int,
        default=0,
        help="also this many voice-assistant sentences per intent (home-assistant-intents)",
    )
    ap.add_argument(
        "--numbers",
        type=int,
        default=0,
        help="also this many numbers read in chunks (phone, card, zip ...; whole and cut)",
    )
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    cfg = load_config(args.config)
    cache = cache_dir(cfg.models)
    model_dir = str(resolve_llm(cfg.models.llm, cache))
    ecfg = dataclasses.replace(engine_config(cfg.llm, str(cache)), turn_head="none")
    core = build_core(model_dir, ecfg.on_device())
    system = cfg.llm.system_prompt

    lines = corpus_lines(args.min_words)
    if args.commands:
        lines += command_lines(args.commands, args.seed)
    rng.shuffle(lines)
    held = len(lines) // 5
    t0 = time.perf_counter()
    sets = {}
    numbers = number_examples(args.numbers, rng)
    held_numbers = len(numbers) // 5 // 4 * 4  # whole numbers' four examples stay together
    for name, part, extra in (
        ("train", lines[held:], numbers[held_numbers:]),
        ("held-out", lines[:held], numbers[:held_numbers]),
    ):
        ex = examples(part, rng) + extra
        feats = [last_hidden(core, system, t) for t, _ in ex]
        x = np.stack([h for h, _ in feats])
        y = np.array([y for _, y in ex], float)
        weights = balance([t for t, _ in ex], y) if args.balance else np.ones(len(y))
        sets[name] = (x, y, np.array([p for _, p in feats]), weights)
    print(f"features: {len(lines)} lines, {time.perf_counter() - t0:.0f} s", flush=True)

    x, y, _, weights = sets["train"]
    mu, sd = x.mean(0), x.std(0) + 1e-6
    ones = np.ones((len(x), 1))
    w = logistic(np.hstack([(x - mu) / sd, ones]), y, args.l2, weight=weights, steps=30)
    weight, bias = w[:-1] / sd, w[-1] - float((w[:-1] * mu / sd).sum())  # on the raw state

    xh, yh, ph, _ = sets["held-out"]
    print(f"held-out lines ({len(yh)} examples): AUC head {auc(xh @ weight + bias, yh):.3f}, ")
    print(f"  zero-shot P(end) {auc(ph, yh):.3f}")
    from voicert.engine.core.turn_head import save_turn_head

    meta = {
        "model": Path(model_dir).name,
        "system_prompt": system,
        "data": "chatterbot-corpus"
        + (f" + home-assistant-intents ({args.commands} per intent)" if args.commands else "")
        + (f" + {args.numbers} numbers read in chunks" if args.numbers else "")
        + f", {len(lines) - held} lines x 4 examples",
        "l2": str(args.l2),
        "seed": str(args.seed),
    }
    norm = core.model.norm.weight
    save_turn_head(args.out, torch.from_numpy(weight), bias, norm, meta)
    print(f"wrote {args.out}")
    if args.signals:
        from voicert.bench.eot import load

        judged = [p for s in load(args.signals) for p in s.pauses if p.audio_prob is not None]
        feats = [last_hidden(core, system, p.text.strip() or "...") for p in judged]
        final = np.array([float(p.final) for p in judged])
        head = np.stack([h for h, _ in feats]) @ weight + bias
        zero = np.array([p for _, p in feats])
        print(f"{args.signals} ({len(judged)} judged pauses): AUC head {auc(head, final):.3f},")
        print(f"  zero-shot P(end) {auc(zero, final):.3f}")


if __name__ == "__main__":
    main()
