"""When to end a turn from everything known at a pause: one hazard, growing with the silence.

At a pause (``turn.pause_ms`` of silence) the session has up to six opinions of whether the
caller has finished: the audio model's P(complete) (smart-turn), and its pause head's, trained
on pauses inside turns (speech/smart_turn.py ``PauseHead``: the prosody of a speaker who will go
on); the LLM's probability that the user's message ends after the transcript so far, as Whisper
wrote it and without the final punctuation Whisper adds wherever the audio stops; and Whisper's
own probabilities, right after the last word it heard, of a sentence end (". ? !") and of a pause
mark (", ..."): it punctuates from the audio, so they carry some of the prosody the words lack
(core/speech.py ``Ending``). :func:`log_odds` combines them into the log-odds that the turn is
over; the silence adds ``RATE`` to it per second (a longer pause is itself evidence). The turn
ends at the first silence where the log-odds reach ``turn.patience`` (:func:`end_after_ms`), and
at ``turn.max_silence_ms`` at the latest. So a turn judged complete ends at once, an uncertain
one after a few hundred ms, and one judged unfinished keeps listening, though never for a fixed
cliff: it ends when its pause has outlasted its doubt.

With an engine whose model has a trained end-of-turn head (engine/core/turn_head.py), the text
opinion is that head's P(over) with the as-written score, from one request (:data:`WITH_HEAD`);
without one, the two zero-shot scores (:data:`ZERO_SHOT`).

The weights are a logistic regression of "the turn ended here" against "the speaker went on"
over the evaluation set's pauses (bench/turn_set.py: the first batch's clean renderings, the
second batch held out; ``python -m voicert.bench.turns --eot --fit`` refits them). Over the set's
judged pauses the head and Whisper's odds tell the most (AUC 0.85 and 0.84 alone, 0.875 together,
cross-validated by sentence); smart-turn's weight comes out near zero (docs/benchmarks.md 45).
They are the model's, not the caller's: a caller who pauses long (:class:`PauseHabit`) makes the
silence count for less. With ``turn.text_cue`` the word cue counts too: a transcript whose last words
cannot end a sentence waits about 500 ms more, and one that asks a question about 250 ms less.

Pure functions and a small state: no clock, no models.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from voicert.core.speech import Ending
from voicert.speech.turn_text import continues


@dataclass(frozen=True, slots=True)
class Weights:
    """The hazard's log-odds per unit of each opinion's logit, and for each word cue."""

    w0: float  # the intercept: a pause the evidence says nothing of
    audio: float  # logit(smart-turn's P(complete))
    text: float  # logit(LLM P(end of message) after the transcript as written)
    bare: float  # ... after it without its final punctuation
    head: float  # logit(the LLM's end-of-turn head's P(over))
    # the words dangle ("a table for", "my number is five five five,": speech/turn_text.continues):
    # not fit but chosen on the set, where it cuts cut-offs at patience 2 from 27.6 to 23.2 % for
    # +33 ms of mean dead air (docs/benchmarks.md section 36): about 500 ms more wait
    dangling: float = -2.0
    # the transcript is a question that does not dangle ("...open on Sunday?"): chosen on the set
    # as well, where it takes the mean dead air after complete questions from 556 to 473 ms (CPU,
    # 8 s window) for +0.6 points of cut-offs
    question: float = 1.0
    stop: float = 0.0  # logit(the recogniser's P(sentence end) after the last word)
    comma: float = 0.0  # logit(its P(pause mark) there)
    pause: float = 0.0  # logit(the audio model's pause head's P(complete))


# zero-shot: an LLM with no end-of-turn head, scored as written and bare, with Whisper's odds;
# refit with them on the first batch's clean renderings (docs/benchmarks.md 45)
ZERO_SHOT = Weights(w0=-1.33, audio=-0.05, text=0.1, bare=0.08, head=0.0, stop=0.34, comma=-0.67)
# with the end-of-turn head (engine/core/turn_head.py): audio, head, the as-written score and
# Whisper's odds, refit the same way (python -m voicert.bench.turns --eot --fit)
WITH_HEAD = Weights(w0=-2.45, audio=-0.04, text=0.05, bare=0.0, head=0.44, stop=0.26, comma=-0.66)
# the same two with the audio model's pause head (speech/smart_turn.py PauseHead) as well, refit
# the same way on its opinions (docs/benchmarks.md 48): they take over wherever it gave one
ZERO_SHOT_PAUSE = Weights(-2.32, 0.03, 0.14, 0.06, 0.0, stop=0.43, comma=-0.7, pause=0.57)
WITH_HEAD_PAUSE = Weights(-3.23, 0.07, 0.09, 0.0, 0.63, stop=0.38, comma=-0.59, pause=0.64)
RATE = 4.0  # log-odds the silence adds per second after the judgement
FLOOR = 1e-6  # probabilities are clipped to [FLOOR, 1 - FLOOR] (logits of +-13.8)
# a missing opinion counts as its average over the set's judged pauses (no evidence either way)
PRIOR_AUDIO, PRIOR_TEXT, PRIOR_BARE, PRIOR_HEAD = 0.26, -3.88, -11.35, 0.07
PRIOR_STOP, PRIOR_COMMA = 0.54, -3.33
PRIOR_PAUSE = 1.09


@dataclass(frozen=True, slots=True)
class Evidence:
    """The opinions in at a pause (None: not asked, or failed: it counts as no opinion)."""

    audio: float | None = None  # the audio model's P(complete)
    text: float | None = None  # the LLM's P(end of message) after the transcript
    bare: float | None = None  # ... after the transcript without its final punctuation
    dangling: bool = False  # the transcript's last words cannot end a sentence (the word cue)
    question: bool = False  # it ends with a question mark, and does not dangle
    head: float | None = None  # the LLM's end-of-turn head's P(over) (an engine with one)
    ending: Ending | None = None  # the recogniser's odds of a stop or a comma after the last word
    pause: float | None = None  # the audio model's pause head's P(complete) (turn.audio_head)


def logit(p: float | None, prior: float = 0.0) -> float:
    """log(p / (1 - p)), ``p`` clipped to [FLOOR, 1 - FLOOR]; ``prior`` for no opinion."""
    if p is None:
        return prior
    p = min(max(p, FLOOR), 1 - FLOOR)
    return math.log(p / (1 - p))


def weights(ev: Evidence) -> Weights:
    """The weights fit for the opinions ``ev`` has: with or without the end-of-turn head's, and
    with or without the pause head's."""
    if ev.pause is None:
        return ZERO_SHOT if ev.head is None else WITH_HEAD
    return ZERO_SHOT_PAUSE if ev.head is None else WITH_HEAD_PAUSE


def log_odds(ev: Evidence) -> float:
    """The log-odds that the turn is over, from the opinions alone (no silence yet counted),
    under :func:`weights`."""
    w = weights(ev)
    return (
        w.w0
        + w.audio * logit(ev.audio, PRIOR_AUDIO)
        + w.text * logit(ev.text, PRIOR_TEXT)
        + w.bare * logit(ev.bare, PRIOR_BARE)
        + w.head * logit(ev.head, PRIOR_HEAD)
        + w.stop * logit(None if ev.ending is None else ev.ending.stop, PRIOR_STOP)
        + w.comma * logit(None if ev.ending is None else ev.ending.comma, PRIOR_COMMA)
        + w.pause * logit(ev.pause, PRIOR_PAUSE)
        + w.dangling * ev.dangling
        + w.question * ev.question
    )


def end_after_ms(
    ev: Evidence, judge_ms: int, max_ms: int, bias: float = 0.0, pause_scale: float = 1.0
) -> float:
    """The silence (ms, from the last voiced audio) after which the turn ends: at ``judge_ms``
    (when the opinions were formed) if they already reach ``bias`` (``turn.patience``), else
    once the silence has added the rest at ``RATE`` per second (slower by ``pause_scale`` for
    a caller who pauses long); at most ``max_ms``."""
    short = bias - log_odds(ev)
    if short <= 0:
        return float(judge_ms)
    return min(judge_ms + 1000.0 * pause_scale * short / RATE, float(max_ms))


def bare(text: str) -> str:
    """A transcript without the final punctuation Whisper writes wherever the audio stops."""
    return text.strip().rstrip(".?!,;:…-").rstrip()


def text_cues(text: str) -> tuple[bool, bool]:
    """(dangling, question) of a transcript: the word cue's two opinions."""
    dangling = continues(text)
    return dangling, not dangling and text.rstrip().endswith("?")


class PauseHabit:
    """How long this caller pauses inside a turn: a running average of the pauses after which
    they went on speaking (only those long enough to have been judged). ``scale`` is how much
    slower the silence counts for them: 1 at ``REFERENCE_MS`` or less, up to ``MOST``."""

    REFERENCE_MS = 500.0  # a caller pausing this long (or less) inside turns: the model's speed
    MOST = 2.0
    WEIGHT = 0.3  # of each new pause in the average

    def __init__(self) -> None:
        self.mean_ms: float | None = None

    def observe(self, pause_ms: float) -> None:
        """A pause of ``pause_ms`` after which the caller went on with the same turn."""
        if self.mean_ms is None:
            self.mean_ms = pause_ms
        else:
            self.mean_ms += self.WEIGHT * (pause_ms - self.mean_ms)

    @property
    def scale(self) -> float:
        if self.mean_ms is None:
            return 1.0
        return min(max(self.mean_ms / self.REFERENCE_MS, 1.0), self.MOST)
