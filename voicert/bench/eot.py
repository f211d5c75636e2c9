"""End-of-turn figures in eot-bench's terms, offline: ``python -m voicert.bench.turns --eot``.

Every rendering of the set (bench/turn_set.py) is scored by the real models the server runs, on
this machine: Silero VAD over 32 ms windows finds each pause inside speech the way the endpointer
does; at ``turn.pause_ms`` of silence into each pause the judgement's inputs are computed from the
audio up to there, as a session computes them: smart-turn's P(complete), the early transcript
(Whisper) with Whisper's odds of a stop or a comma after its last word, the word cue, and the
LLM's end-of-turn probability of that transcript (an engine ``score_end`` request). The compute
each took is measured too.

A detector is then a rule from those signals and the silence so far to a decision; each has one
knob (a threshold, or the silence for the silence rule), swept. For every setting:

- **false cut-off rate**: the share of renderings with a pause inside the turn where the rule
  ended the turn in one of those pauses (answered half-heard);
- **dead air**: per rendering, the silence after its last word before the rule ended the turn,
  counting the judgement's measured compute where the rule waited for it (mean and P95).

eot-bench's two figures follow: the lowest cut-off rate among the settings whose mean dead air
fits a budget (300 ms, 500 ms), and the lowest mean dead air among the settings that cut off at
most 5 %.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from voicert.agent.hazard import bare
from voicert.bench.turn_set import SAMPLE_RATE, Rendering
from voicert.speech.endpoint import WINDOW_MS

LEAD_S = 0.3  # silence before the first word
TAIL_S = 2.0  # silence after the last word (longer than any maximum wait)
BUDGETS_MS = (300, 500)
CUT_OFF_GOAL = 0.05


@dataclass
class Pause:
    """One silence inside speech, as the endpointer sees it, and the judgement's inputs there."""

    start_ms: float  # from the rendering's first sample: where the silence began
    length_ms: float  # until voice came back (the final pause: until the audio ended)
    final: bool  # no voice after it: the true end of the turn
    audio_prob: float | None = None  # smart-turn P(complete) at the judgement
    pause_prob: float | None = None  # its pause head's (turn.audio_head), on the same forward pass
    text: str = ""  # the early transcript at the judgement
    text_prob: float | None = None  # the LLM's P(end of message) after that transcript
    bare_prob: float | None = None  # ... after it without its final punctuation (Whisper's guess)
    turn_prob: float | None = None  # the LLM's end-of-turn head's P(over) after that transcript
    stop_prob: float | None = None  # Whisper's P(. ? !) right after the transcript's last word
    comma_prob: float | None = None  # ... and its P(, ...) there (core/speech.py Ending)
    audio_ms: float = 0.0  # compute: smart-turn
    asr_ms: float = 0.0  # compute: the early decode
    score_ms: float = 0.0  # compute: the LLM's two scores (as written, bare), one batch
    early_ms: int = 0  # silence at which the early decode started (its audio ends there)


@dataclass
class Scored:
    """A rendering's pauses and its final transcript."""

    id: str
    kind: str
    category: str
    voice: str
    condition: str
    words: str
    transcript: str = ""
    pauses: list[Pause] = field(default_factory=list)

    @property
    def item(self) -> str:
        """The set's item this renders (``id`` is item-voice-condition)."""
        return self.id.split("-")[0]


# ------------------------------------------------------------------ signals


def find_pauses(probs: np.ndarray, threshold: float, neg_threshold: float, end_ms: float) -> list:
    """(start_ms, length_ms) of every silence inside speech, from per-window VAD probabilities:
    a run of windows below ``neg_threshold`` after a voiced one (>= ``threshold``) and before
    the next voiced one (or the audio's end). Times are window ends, as the endpointer counts."""
    out = []
    last_voiced: int | None = None
    silent_from: int | None = None
    for w, p in enumerate(probs):
        if p >= threshold:
            if silent_from is not None and last_voiced is not None:
                out.append(((last_voiced + 1) * WINDOW_MS, (w - last_voiced - 1) * WINDOW_MS))
            last_voiced, silent_from = w, None
        elif p < neg_threshold and last_voiced is not None and silent_from is None:
            silent_from = w
    if last_voiced is not None:
        start = (last_voiced + 1) * WINDOW_MS
        out.append((start, end_ms - start))
    return out


def on_the_line(r: Rendering) -> np.ndarray:
    """The rendering as a caller's line carries it: LEAD_S of silence before, TAIL_S after."""
    return r.padded(int(LEAD_S * SAMPLE_RATE), int(TAIL_S * SAMPLE_RATE))


def up_to(x: np.ndarray, ms: float) -> np.ndarray:
    """The first ``ms`` of ``x`` (16 kHz): the audio heard by that time."""
    return x[: int(ms * SAMPLE_RATE / 1000)]


def heard_pauses(vad, vad_cfg, r: Rendering) -> tuple[np.ndarray, list[Pause]]:
    """(the rendering as a line carries it: LEAD_S before, TAIL_S after; every pause in it as
    the endpointer finds them with ``vad`` (a SileroVad) under ``vad_cfg``, times from that
    audio's first sample, the last one final)."""
    from voicert.speech.vad import FRAME, VadState

    x = on_the_line(r)
    n = x.size // FRAME
    probs = vad.probs(x[: n * FRAME].reshape(n, FRAME), VadState())
    true_end_ms = LEAD_S * 1000 + r.end * 1000 / SAMPLE_RATE
    found = find_pauses(probs, vad_cfg.threshold, vad_cfg.neg_threshold, n * WINDOW_MS)
    # final: no voiced audio after it (VAD hangs on ~1 window), or no voice at all after it
    return x, [
        Pause(start, length, start + 64 >= true_end_ms or k == len(found) - 1)
        for k, (start, length) in enumerate(found)
    ]


class Scorer:
    """The server's models as ``cfg`` sets them (its ``asr`` and ``llm`` sections), loaded once:
    VAD, smart-turn, Whisper, and the engine core."""

    def __init__(self, cfg, asr: str = "") -> None:
        """``asr``: the Whisper model (default ``models.asr``)."""
        from voicert.config import cache_dir
        from voicert.engine.build import build_core
        from voicert.engine.loader import resolve_llm
        from voicert.engine.settings import engine_config
        from voicert.speech import smart_turn
        from voicert.speech.asr import WhisperAsr, resolve_asr_model
        from voicert.speech.vad import SileroVad

        self.cfg = cfg
        cache = cache_dir(cfg.models)
        self.vad = SileroVad()
        t = cfg.turn
        self.smart_turn = smart_turn.load(t.model_path, t.device, t.audio_head)
        self.asr = WhisperAsr(cfg.asr, str(resolve_asr_model(asr or cfg.models.asr, cache)))
        model_dir = str(resolve_llm(cfg.models.llm, cache))
        self.core = build_core(model_dir, engine_config(cfg.llm, str(cache)).on_device())
        self.system_prompt = cfg.llm.system_prompt
        self._n = 0

    def text_probs(self, texts: list[str]) -> list[tuple[float | None, float | None]]:
        """The LLM's (P(end of message), its end-of-turn head's P(over)) after each text, as
        a session asks: all at once (one prefill step for all of them, their common prefix
        cached)."""
        from voicert.core.chat import ChatMessage
        from voicert.core.llm import GenerationRequest

        ids: dict[str, int] = {}
        for i, text in enumerate(texts):
            if text.strip():
                self._n += 1
                ids[f"s{self._n}"] = i
                msgs = [ChatMessage("system", self.system_prompt), ChatMessage("user", text)]
                self.core.add(GenerationRequest(f"s{self._n}", msgs, 1, score_end=True))
        probs: list[tuple[float | None, float | None]] = [(None, None)] * len(texts)
        while self.core.has_work():
            for out in self.core.step():
                if out.request_id in ids and out.finish_reason is not None:
                    probs[ids[out.request_id]] = out.end_prob, out.turn_prob
        return probs

    def rescore(self, scored: list[Scored]) -> None:
        """The text scores of saved signals again, from their transcripts, with this LLM (and
        its end-of-turn head): the audio and the decodes as they were."""
        for s in scored:
            for p in s.pauses:
                if p.audio_prob is not None:
                    self._score_texts(p)

    def _score_texts(self, p: Pause) -> None:
        t0 = time.perf_counter_ns()
        (p.text_prob, p.turn_prob), (p.bare_prob, _) = self.text_probs(
            [p.text.strip(), bare(p.text)]
        )
        p.score_ms = (time.perf_counter_ns() - t0) / 1e6

    def score(self, r: Rendering, judge_ms: int, early_ms: int) -> Scored:
        """Its pauses, each judged as a session judges it: the audio model at ``judge_ms`` of
        silence, the early decode (and its scores) on the audio up to ``early_ms``."""
        out = Scored(r.id, r.item.kind, r.item.category, r.voice, r.condition, r.words.strip(), "")
        out.transcript = self.asr.transcribe_sync(r.audio).text
        x, pauses = heard_pauses(self.vad, self.cfg.vad, r)
        for p in pauses:
            if p.length_ms >= judge_ms:
                p.early_ms = min(early_ms, judge_ms)
                self._judge(p, up_to(x, p.start_ms + judge_ms), up_to(x, p.start_ms + p.early_ms))
            out.pauses.append(p)
        return out

    def _judge(self, p: Pause, audio: np.ndarray, early: np.ndarray) -> None:
        t0 = time.perf_counter_ns()
        own, head = self.smart_turn.score_both([audio])
        p.audio_prob = float(own[0])
        p.pause_prob = None if head is None else float(head[0])
        t1 = time.perf_counter_ns()
        heard = self.asr.transcribe_sync(early)
        p.text = heard.text
        if heard.ending is not None:
            p.stop_prob, p.comma_prob = heard.ending.stop, heard.ending.comma
        p.audio_ms, p.asr_ms = (t1 - t0) / 1e6, (time.perf_counter_ns() - t1) / 1e6
        self._score_texts(p)


def rejudge_audio(model, scored: list[Scored], renderings: list[Rendering], judge_ms: int) -> int:
    """The audio opinions (smart-turn's, its pause head's) of saved signals again by ``model``
    (a SmartTurn), from the renderings they were judged on, where the pause head's is missing
    (signals saved before it): the decodes and scores as they were. Returns how many pauses
    were judged again (none when ``model`` has no head)."""
    by_id = {r.id: r for r in renderings}
    n = 0
    for s in scored:
        todo = [p for p in s.pauses if p.audio_prob is not None and p.pause_prob is None]
        if not todo or s.id not in by_id:
            continue
        x = on_the_line(by_id[s.id])
        own, head = model.score_both([up_to(x, p.start_ms + judge_ms) for p in todo])
        if head is None:
            return n
        for p, o, h in zip(todo, own, head):
            p.audio_prob, p.pause_prob = float(o), float(h)
        n += len(todo)
    return n


def save(scored: list[Scored], path: Path) -> None:
    path.write_text(json.dumps([asdict(s) for s in scored], indent=1))


def load(path: Path) -> list[Scored]:
    out = []
    for d in json.loads(path.read_text()):
        pauses = [Pause(**p) for p in d.pop("pauses")]
        out.append(Scored(**d, pauses=pauses))
    return out


# ------------------------------------------------------------------ detectors

# a rule: (pause, setting) -> the silence in ms after which it ends the turn (math.inf: never)
Rule = Callable[[Pause, float], float]


@dataclass(frozen=True)
class Detector:
    name: str
    rule: Rule
    settings: tuple[float, ...]  # swept
    default: float  # the configured setting


@dataclass(frozen=True)
class Point:
    setting: float
    cut_off: float  # share of renderings with inner pauses that were cut off
    dead_mean: float
    dead_p95: float


def evaluate(scored: list[Scored], rule: Rule, setting: float) -> Point:
    cut, with_inner, dead = 0, 0, []
    for s in scored:
        inner = [p for p in s.pauses if not p.final]
        if inner:
            with_inner += 1
            cut += any(rule(p, setting) < p.length_ms for p in inner)
        final = [p for p in s.pauses if p.final]
        if final and not any(rule(p, setting) < p.length_ms for p in inner):
            dead.append(rule(final[-1], setting))
    if not dead:  # every turn was cut off (or none had an end): no dead air to speak of
        return Point(setting, cut / max(with_inner, 1), math.inf, math.inf)
    return Point(
        setting,
        cut / max(with_inner, 1),
        float(np.mean(dead)),
        float(np.percentile(dead, 95)),
    )


@dataclass(frozen=True)
class Figures:
    name: str
    default: Point
    cut_at: dict[int, Point | None]  # budget ms -> the best setting within it
    at_goal: Point | None  # the least dead air at <= 5 % cut-offs


def figures(scored: list[Scored], d: Detector) -> Figures:
    points = [evaluate(scored, d.rule, s) for s in d.settings]
    cut_at = {}
    for budget in BUDGETS_MS:
        fit = [p for p in points if p.dead_mean <= budget]
        cut_at[budget] = min(fit, key=lambda p: (p.cut_off, p.dead_mean)) if fit else None
    ok = [p for p in points if p.cut_off <= CUT_OFF_GOAL]
    at_goal = min(ok, key=lambda p: (p.dead_mean, p.cut_off)) if ok else None
    return Figures(d.name, evaluate(scored, d.rule, d.default), cut_at, at_goal)


def _ready(p: Pause, judge_ms: int, audio: bool, text: bool = False, score: bool = False) -> float:
    """The silence (ms) by which a judgement's inputs are in: the audio model's from
    ``judge_ms``; the early transcript from when its decode started, then its LLM scores."""
    ready = judge_ms + (p.audio_ms if audio else 0.0)
    if text:
        ready = max(ready, p.early_ms + p.asr_ms + (p.score_ms if score else 0.0))
    return ready


def detectors(judge_ms: int, max_ms: int, patience: float = 2.0) -> list[Detector]:
    """Today's detectors and the hazard, each with its knob's sweep and its configured value."""
    from voicert.speech.turn_text import continues

    def judged(p: Pause) -> bool:
        return p.audio_prob is not None

    def silence(p: Pause, ms: float) -> float:
        return ms

    def audio(p: Pause, th: float) -> float:
        if not judged(p):
            return max_ms
        done = (p.audio_prob or 0.0) >= th
        return _ready(p, judge_ms, True) if done else max_ms

    def semantic(p: Pause, th: float) -> float:  # today's rule (agent/turns.py _decide)
        if not judged(p):
            return max_ms
        if continues(p.text):
            return max_ms
        done = (p.audio_prob or 0.0) >= th or p.text.rstrip().endswith("?")
        return _ready(p, judge_ms, True, True) if done else max_ms

    def text(p: Pause, th: float) -> float:
        if not judged(p) or p.text_prob is None:
            return max_ms
        done = math.log10(max(p.text_prob, 1e-12)) >= th
        return _ready(p, judge_ms, False, True, True) if done else max_ms

    def hazard(
        p: Pause, th: float, head: bool = True, audio: bool = True, pause: bool = True
    ) -> float:
        """``audio`` False: as ``turn.model: none`` runs it, without smart-turn (its opinions
        count as their averages, and the verdict does not wait for it); ``pause`` False: as
        ``turn.audio_head: none`` runs it."""
        from voicert.agent.hazard import Evidence, end_after_ms, text_cues
        from voicert.core.speech import Ending

        if not judged(p):
            return max_ms
        turn = p.turn_prob if head else None
        said = p.stop_prob is not None and p.comma_prob is not None
        ev = Evidence(
            p.audio_prob if audio else None,
            p.text_prob,
            p.bare_prob,
            *text_cues(p.text),
            head=turn,
            ending=Ending(p.stop_prob, p.comma_prob) if said else None,
            pause=p.pause_prob if audio and pause else None,
        )
        decided = end_after_ms(ev, judge_ms, max_ms, bias=th)
        return max(decided, _ready(p, judge_ms, audio, True, True))

    def zero_shot(p: Pause, th: float) -> float:
        return hazard(p, th, head=False)

    def text_only(p: Pause, th: float) -> float:
        return hazard(p, th, audio=False)

    def no_pause_head(p: Pause, th: float) -> float:
        return hazard(p, th, pause=False)

    def pause_head(p: Pause, th: float) -> float:
        if not judged(p) or p.pause_prob is None:
            return max_ms
        return _ready(p, judge_ms, True) if p.pause_prob >= th else max_ms

    grid = tuple(np.round(np.linspace(0.05, 0.95, 19), 2))
    return [
        Detector("silence", silence, tuple(range(96, max_ms + 1, 32)), 400),
        Detector("smart-turn", audio, grid, 0.5),
        Detector("smart-turn's pause head", pause_head, grid, 0.5),
        Detector("semantic (today)", semantic, grid, 0.5),
        Detector("text score", text, tuple(np.round(np.arange(-6, 0.01, 0.25), 2)), -2.0),
        Detector("hazard", hazard, tuple(np.round(np.arange(-2, 6.01, 0.25), 2)), patience),
        Detector(
            "hazard, zero-shot text",
            zero_shot,
            tuple(np.round(np.arange(-2, 6.01, 0.25), 2)),
            patience,
        ),
        Detector(
            "hazard without the pause head",
            no_pause_head,
            tuple(np.round(np.arange(-2, 6.01, 0.25), 2)),
            patience,
        ),
        Detector(
            "hazard without smart-turn",
            text_only,
            tuple(np.round(np.arange(-2, 6.01, 0.25), 2)),
            patience,
        ),
    ]


def _ms(p: Point | None, with_p95: bool = False) -> str:
    if p is None:
        return "—"
    if with_p95:
        return f"{p.dead_mean:.0f} / {p.dead_p95:.0f} ms ({p.cut_off:.1%})"
    return f"{p.cut_off:.1%} ({p.dead_mean:.0f} ms)"


def table(scored: list[Scored], judge_ms: int, max_ms: int, patience: float = 2.0) -> str:
    """eot-bench's figures per detector, as a markdown table."""
    rows = [
        "| detector | configured: cut-offs (mean dead air) | cut-offs at 300 ms | at 500 ms "
        "| dead air at <= 5 % cut-offs: mean / P95 (cut-offs) |",
        "|---|---:|---:|---:|---:|",
    ]
    for d in detectors(judge_ms, max_ms, patience):
        f = figures(scored, d)
        rows.append(
            f"| {f.name} | {_ms(f.default)} | {_ms(f.cut_at[300])} | {_ms(f.cut_at[500])} "
            f"| {_ms(f.at_goal, True)} |"
        )
    return "\n".join(rows)


def by_category(scored: list[Scored], judge_ms: int, max_ms: int, patience: float = 2.0) -> str:
    """Each detector's cut-off share per item category, at its configured setting (where a
    detector loses, and to which words)."""
    dets = detectors(judge_ms, max_ms, patience)
    cats = sorted({s.category for s in scored if any(not p.final for p in s.pauses)})
    rows = [
        "| category | renderings | " + " | ".join(d.name for d in dets) + " |",
        "|---|---:|" + "---:|" * len(dets),
    ]
    for cat in cats:
        part = [s for s in scored if s.category == cat]
        shares = [evaluate(part, d.rule, d.default).cut_off for d in dets]
        inner = sum(1 for s in part if any(not p.final for p in s.pauses))
        rows.append(f"| {cat} | {inner} | " + " | ".join(f"{x:.0%}" for x in shares) + " |")
    return "\n".join(rows)


def run(
    cfg,
    conditions: tuple[str, ...],
    asr: str,
    signals: Path | None,
    renderings: Path | None = None,
    rescore: bool = False,
    fit: bool = False,
) -> str:
    """Score the set with the models ``cfg`` sets (or read the signals saved by an earlier run,
    with ``rescore`` their text scores again with ``cfg``'s LLM, and save them back), and the
    tables for its ``turn`` settings: all conditions together, then each."""

    turn = cfg.turn
    judge_ms, max_ms, patience = turn.pause_ms, turn.max_silence_ms, turn.patience
    early_ms = min(cfg.asr.early_final_ms or judge_ms, judge_ms)
    scorer: Scorer | None = None
    scored: list[Scored] = []
    if signals is not None and signals.exists():
        scored = [s for s in load(signals) if s.condition in conditions]
        if rescore:
            scorer = Scorer(cfg, asr)
            scorer.rescore(scored)
    rejudged = 0
    if (
        renderings is not None
        and renderings.exists()
        and any(p.audio_prob is not None and p.pause_prob is None for s in scored for p in s.pauses)
    ):
        from voicert.bench.turn_set import load_renderings

        scorer = scorer or Scorer(cfg, asr)
        rejudged = rejudge_audio(scorer.smart_turn, scored, load_renderings(renderings), judge_ms)
    todo = _to_render(scored, conditions, renderings)
    if todo:
        scorer = scorer or Scorer(cfg, asr)
        for i, r in enumerate(todo):
            scored.append(scorer.score(r, judge_ms, early_ms))
            if (i + 1) % 50 == 0 or i + 1 == len(todo):
                print(f"  scored {i + 1}/{len(todo)}", flush=True)
    if signals is not None and (todo or rescore or rejudged):
        save(scored, signals)
    inner = sum(1 for s in scored if any(not p.final for p in s.pauses))
    judged = [p for s in scored for p in s.pauses if p.audio_prob is not None]
    voices = sorted({s.voice.split(":")[0] for s in scored})
    lines = [
        f"{len(scored)} renderings ({inner} with pauses inside the turn), {len(judged)} "
        f"judged pauses; voices: {', '.join(voices)}; "
        f"judgement at {judge_ms} ms (the early decode at {early_ms}), maximum {max_ms} ms; "
        f"ASR {asr or cfg.models.asr}, encoder window {cfg.asr.min_window_s:g} s",
        "judgement compute on this machine, P50 / P95: smart-turn "
        + _pct([p.audio_ms for p in judged])
        + ", early decode "
        + _pct([p.asr_ms for p in judged])
        + ", LLM score "
        + _pct([p.score_ms for p in judged])
        + " (both texts, one batch)",
        f"WER of the final transcripts: {wer(scored):.1%}",
    ]
    for cond in ("all", *conditions) if len(conditions) > 1 else conditions:
        part = scored if cond == "all" else [s for s in scored if s.condition == cond]
        lines += [
            "",
            f"### {cond} ({len(part)} renderings)",
            "",
            table(part, judge_ms, max_ms, patience),
        ]
    held = held_out(scored)
    if held:
        lines += [
            "",
            f"### held out: the second batch of texts ({len(held)} renderings, all conditions), "
            "written after the hazard's weights and the head were fit",
            "",
            table(held, judge_ms, max_ms, patience),
        ]
    lines += [
        "",
        "### cut-offs by category, configured settings",
        "",
        by_category(scored, judge_ms, max_ms, patience),
    ]
    if fit:
        held = {s.id for s in held_out(scored)}  # never fit on: they judge the fit
        clean = [s for s in scored if s.condition == "clean" and s.id not in held] or scored
        lines += [
            "",
            "### the hazard's weights, refit on the first batch's clean renderings",
            "",
            fit_report(scored, clean, judge_ms, max_ms),
        ]
    return "\n".join(lines)


def held_out(scored: list[Scored]) -> list[Scored]:
    """The renderings of the items written after the weights were fit (turn_set's batch 2)."""
    from voicert.bench.turn_set import ITEMS

    batch = {i.id: i.batch for i in ITEMS}
    return [s for s in scored if batch.get(s.item) == 2]


def _to_render(
    scored: list[Scored], conditions: tuple[str, ...], renderings: Path | None
) -> list[Rendering]:
    """The renderings still to score: those of items and conditions the saved signals
    (``scored``) lack, so signals saved before items were added are completed, not redone;
    read from ``renderings`` where it holds them, else rendered (and saved there)."""
    from voicert.bench.turn_set import (
        ITEMS,
        human_renderings,
        load_renderings,
        render_set,
        save_renderings,
    )

    have = {(s.item, s.condition) for s in scored}
    synthetic = tuple(c for c in conditions if c != "human")
    items = [i for i in ITEMS if any((i.id, c) not in have for c in synthetic)]
    saved = load_renderings(renderings) if renderings is not None and renderings.exists() else []
    on_file = {(r.item.id, r.condition) for r in saved}
    todo = [r for r in saved if r.condition in synthetic and (r.item.id, r.condition) not in have]
    new = [i for i in items if any((i.id, c) not in on_file for c in synthetic)]
    if new:
        made = [r for r in render_set(synthetic, new) if (r.item.id, r.condition) not in on_file]
        todo += [r for r in made if (r.item.id, r.condition) not in have]
        if renderings is not None:
            save_renderings(saved + made, renderings)
    if "human" in conditions and not any(s.condition == "human" for s in scored):
        todo += human_renderings()
    return todo


def _pct(xs: list[float]) -> str:
    if not xs:
        return "—"
    return f"{np.percentile(xs, 50):.0f} / {np.percentile(xs, 95):.0f} ms"


def wer(scored: list[Scored]) -> float:
    """Corpus WER (a fraction) of the final transcripts, Whisper's normaliser where installed."""
    from voicert.bench import asr_eval

    pairs = [(s.words, s.transcript) for s in scored]
    try:
        return asr_eval.wer(pairs, asr_eval.whisper_normalize) / 100
    except ImportError:
        return asr_eval.wer(pairs) / 100


# ------------------------------------------------------------------ the hazard's weights


def _opinions(p: Pause, head: bool) -> list[float]:
    """A judged pause's logits: audio, text as written, then bare (zero-shot) or head, Whisper's
    sentence end and pause mark after the last word, the pause head's, then 1."""
    from voicert.agent import hazard as hz
    from voicert.agent.hazard import logit

    second = logit(p.turn_prob, hz.PRIOR_HEAD) if head else logit(p.bare_prob, hz.PRIOR_BARE)
    return [
        logit(p.audio_prob, hz.PRIOR_AUDIO),
        logit(p.text_prob, hz.PRIOR_TEXT),
        second,
        logit(p.stop_prob, hz.PRIOR_STOP),
        logit(p.comma_prob, hz.PRIOR_COMMA),
        logit(p.pause_prob, hz.PRIOR_PAUSE),
        1.0,
    ]


def _cue_offset(p: Pause, w) -> float:
    from voicert.agent.hazard import text_cues

    dangling, question = text_cues(p.text)
    return w.dangling * dangling + w.question * question


def logistic(
    x: np.ndarray,
    y: np.ndarray,
    l2: float,
    offset: np.ndarray | None = None,
    weight: np.ndarray | None = None,
    steps: int = 50,
) -> np.ndarray:
    """L2-regularised logistic regression by Newton steps: x [n, d] (a column of ones for an
    intercept), labels y [n] -> coefficients [d]; ``offset`` [n] is added to each row's log-odds
    and ``weight`` [n] weighs each row (default: none, and all 1)."""
    off = np.zeros(len(y)) if offset is None else offset
    wt = np.ones(len(y)) if weight is None else weight
    w = np.zeros(x.shape[1])
    for _ in range(steps):
        q = 1 / (1 + np.exp(-(x @ w + off)))
        hess = x.T @ (x * (wt * q * (1 - q))[:, None]) + l2 * np.eye(len(w))
        w -= np.linalg.solve(hess, x.T @ (wt * (q - y)) + l2 * w)
    return w


def auc(score: np.ndarray, label: np.ndarray) -> float:
    """P(a positive outscores a negative), ties counted half."""
    pos, neg = score[label == 1], score[label == 0]
    greater = (pos[:, None] > neg[None, :]).mean()
    ties = (pos[:, None] == neg[None, :]).mean()
    return float(greater + 0.5 * ties)


def fit_weights(scored: list[Scored], head: bool, pause: bool = True, l2: float = 0.1):
    """The hazard's :class:`~voicert.agent.hazard.Weights` by logistic regression of "the turn
    ended here" over ``scored``'s judged pauses (Newton steps, L2 ``l2``), the word cues' fixed
    weights counted as an offset: audio, as written, and bare (zero-shot) or the head, Whisper's
    odds, and (``pause``) the pause head's opinion."""
    from voicert.agent.hazard import ZERO_SHOT, Weights

    judged = [p for s in scored for p in s.pauses if p.audio_prob is not None]
    x = np.array([_opinions(p, head) for p in judged])  # [n, 7]
    if not pause:
        x[:, 5] = 0.0  # the pause head's column says nothing: its weight stays 0
    y = np.array([float(p.final) for p in judged])
    off = np.array([_cue_offset(p, ZERO_SHOT) for p in judged])
    w = logistic(x, y, l2, offset=off)
    a, t, second, stop, comma, pause_w, w0 = (round(float(v), 2) for v in w)
    bare, text_head = (0.0, second) if head else (second, 0.0)
    return Weights(w0, a, t, bare, text_head, stop=stop, comma=comma, pause=pause_w)


def fit_report(scored: list[Scored], fit_on: list[Scored], judge_ms: int, max_ms: int) -> str:
    """The weights fit on ``fit_on``, zero-shot and with the head, each without and with the
    pause head; and each refit 2-fold by
    sentence over ``scored`` (no sentence judged by weights fit on it): the mean dead air at a
    given cut-off share, swept over patience."""
    from voicert.agent.hazard import RATE

    lines = []
    kinds = [(head, pause) for pause in (False, True) for head in (False, True)]
    for head, pause in kinds:
        name = ("with the head" if head else "zero-shot") + (", pause head" if pause else "")
        w = fit_weights(fit_on, head, pause)
        lines.append(f"{name}, fit on {len(fit_on)} renderings: {w}")
    items = sorted({s.item for s in scored})
    lines += ["", "| opinions (2-fold by sentence) | <= 5 % | <= 10 % | <= 20 % | <= 30 % |"]
    lines.append("|---|---:|---:|---:|---:|")
    for head, pause in kinds:
        odds: dict[int, float] = {}
        for fold in (0, 1):
            test = {it for i, it in enumerate(items) if i % 2 == fold}
            w = fit_weights([s for s in scored if s.item not in test], head, pause)
            wv = [w.audio, w.text, w.head if head else w.bare, w.stop, w.comma, w.pause, w.w0]
            for s in scored:
                if s.item in test:
                    for p in s.pauses:
                        if p.audio_prob is not None:
                            odds[id(p)] = float(np.dot(wv, _opinions(p, head))) + _cue_offset(p, w)

        def rule(p: Pause, th: float, odds=odds) -> float:
            if p.audio_prob is None:
                return float(max_ms)
            short = th - odds[id(p)]
            decided = judge_ms if short <= 0 else min(judge_ms + 1000 * short / RATE, max_ms)
            return max(decided, _ready(p, judge_ms, True, True, True))

        pts = [evaluate(scored, rule, th) for th in np.arange(-2, 8, 0.25)]
        cells = []
        for goal in (0.05, 0.10, 0.20, 0.30):
            ok = [pt for pt in pts if pt.cut_off <= goal]
            best = min(ok, key=lambda pt: pt.dead_mean) if ok else None
            cells.append("—" if best is None else f"{best.dead_mean:.0f} ms")
        name = ("head" if head else "zero-shot") + (" + pause head" if pause else "")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
