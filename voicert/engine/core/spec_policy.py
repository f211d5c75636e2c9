"""When to speculate: per decode step, from the batch size and what speculation has measured.

Speculation pays when a verify step (every row carrying ``k`` drafts) yields more tokens per second
than a plain step: ``L / t_spec(b) > 1 / t_plain(b)``, where ``L`` is the tokens a row gains per
verify step (its accepted drafts + 1) and ``t(b)`` a step's duration at batch size ``b``. At batch 1
a step is bound by reading the weights, so ``k + 1`` positions cost about as much as one and any
acceptance gains; at a large batch the step is bound by arithmetic and a verify step costs up to
``k + 1`` plain ones, so the drafts must nearly all be accepted. Where the line falls depends on
the model, the GPU and the text, so it is measured rather than configured.

:class:`SpecPolicy` keeps, per batch bucket (powers of two), a low quantile of each kind of
step's recent durations, and one moving average of ``L`` (acceptance does not depend on the
batch). Each bucket first tries both kinds (``warm`` timed steps each), then takes the faster per
token and, every ``probe_every`` of its steps (four times as many where the other kind is far
behind), runs the other kind for ``probe_len`` steps so that its figure follows the load and the
text. While a prompt waits for its prefill, decode steps are plain: a newcomer's first token comes
before the others' reply speed. Greedy speculation is lossless, so the choice changes speed only,
never the tokens.

Torch-free, I/O-free and clock-free: the engine core feeds it each decode step's measured duration.
"""

from __future__ import annotations

import collections
import enum
from dataclasses import dataclass, field


class SpecMode(enum.Enum):
    """``llm.spec_policy``: ``adaptive`` decides per step (this module); ``always`` speculates on
    every decode step that can (the behaviour before the policy existed)."""

    ADAPTIVE = "adaptive"
    ALWAYS = "always"


@dataclass(slots=True)
class _Mean:
    """A moving average that starts at its first sample."""

    value: float = 0.0
    n: int = 0

    def add(self, x: float, alpha: float) -> None:
        self.value = x if self.n == 0 else self.value + alpha * (x - self.value)
        self.n += 1


class _Recent:
    """A low quantile (the 25th percentile) of the last ``size`` samples: a step's own cost when
    nothing slowed it. Interference only ever adds time (a first replay of a new shape, another
    thread on the host, a busy moment), so the low end is where a kind's cost shows, and one
    good probe outweighs a warm-up's slow steps."""

    __slots__ = ("n", "samples")

    def __init__(self, size: int = 12) -> None:
        self.samples: collections.deque[float] = collections.deque(maxlen=size)
        self.n = 0

    def add(self, x: float) -> None:
        self.samples.append(x)
        self.n += 1

    @property
    def value(self) -> float:
        if not self.samples:
            return 0.0
        ordered = sorted(self.samples)
        return ordered[(len(ordered) - 1) // 4]


@dataclass(slots=True)
class _Bucket:
    plain: _Recent = field(default_factory=_Recent)  # seconds per plain decode step
    spec: _Recent = field(default_factory=_Recent)  # seconds per verify step
    since_other: int = 0  # steps at this bucket since the kind that lost last ran
    probing: int = 0  # steps of the losing kind still to run in the probe under way
    winner: bool | None = None  # the kind that won when last decided (True: verify steps)


def bucket_of(batch: int) -> int:
    """The power of two at or above ``batch`` (>= 1)."""
    return 1 << max(batch - 1, 0).bit_length()


@dataclass(slots=True)
class SpecDecision:
    """What the policy did at one bucket, for metrics and the bench's table."""

    bucket: int
    plain_ms: float
    spec_ms: float
    speculate: bool


class SpecPolicy:
    """Decides the drafts per row (``k`` or 0) of each decode step. :meth:`drafts` is pure (the
    scheduler may ask twice for one step); :meth:`observe` takes each decode step's outcome."""

    def __init__(
        self,
        k: int,
        mode: SpecMode = SpecMode.ADAPTIVE,
        warm: int = 3,
        probe_every: int = 100,
        probe_len: int = 4,
        alpha: float = 0.1,
    ) -> None:
        """``warm``: timed steps of each kind a bucket measures before choosing;
        ``probe_every``: steps of the winning kind between two runs of the other; ``probe_len``:
        steps in such a run; ``alpha``: the acceptance average's weight of one verify step.

        A step is timed only when the step before it was of the same kind and bucket: a change
        of kind costs the first step of the new kind its overlap with the one before (a step
        launched ahead keeps its predecessor's width), which is the cost of switching, not of
        the kind."""
        if k < 0 or warm < 1 or probe_every < 2 or probe_len < 2 or not 0.0 < alpha <= 1.0:
            raise ValueError(
                "SpecPolicy: k >= 0, warm >= 1, probe_every >= 2, probe_len >= 2, 0 < alpha <= 1"
            )
        self.k = k
        self.mode = mode
        self.warm = warm
        self.probe_every = probe_every
        self.probe_len = probe_len
        self.alpha = alpha
        self._last: tuple[int, bool] | None = None  # the last step's bucket and kind
        self.gain = _Mean()  # tokens a row gains per verify step (accepted drafts + 1)
        self.buckets: dict[int, _Bucket] = {}
        self.spec_steps = 0
        self.plain_steps = 0

    def drafts(self, batch: int, prompts_waiting: bool = False) -> int:
        """Drafts per row for a decode step of ``batch`` rows: ``k`` or 0. ``prompts_waiting``:
        a prompt waits for (the rest of) its prefill; adaptive then plans a plain step, the
        shorter, so that the newcomer's prefill starts sooner (its first token before the others'
        reply speed: with verify steps between prefill chunks, the load sweep's TTFT P99 at 128
        callers went from 15.5 to 27.0 ms, docs/benchmarks.md 22)."""
        if self.k == 0 or self.mode is SpecMode.ALWAYS:
            return self.k
        if prompts_waiting:
            return 0
        b = self.buckets.get(bucket_of(batch))
        if b is None or b.spec.n < self.warm:
            return self.k
        if b.plain.n < self.warm:
            return 0
        best = self._speculate(b)
        if b.probing > 0 or b.since_other >= self._interval(b):
            best = not best  # refresh the other kind's figure
        return self.k if best else 0

    def observe(self, batch: int, drafts: int, seconds: float, rows: int, emitted: int) -> None:
        """A decode step of ``batch`` rows planned with ``drafts`` per row took ``seconds`` and its
        ``rows`` live rows gained ``emitted`` tokens in all."""
        if self.k == 0 or seconds <= 0.0:
            return
        key = bucket_of(batch)
        b = self.buckets.get(key)
        if b is None:
            b = self.buckets[key] = _Bucket()
        kind = bool(drafts)
        steady = self._last == (key, kind)  # not the first of its kind after a switch
        self._last = (key, kind)
        warmed = b.spec.n >= self.warm and b.plain.n >= self.warm
        winner = self._speculate(b) if warmed else None
        if kind:
            self.spec_steps += 1
            if steady:
                b.spec.add(seconds)
            if rows:
                self.gain.add(emitted / rows, self.alpha)
        else:
            self.plain_steps += 1
            if steady:
                b.plain.add(seconds)
        if winner is None:
            return
        if winner != b.winner:  # a new winner: any probe of it is over
            b.winner, b.probing, b.since_other = winner, 0, 0
        if kind == winner:
            b.since_other += 1
        elif b.probing > 0:  # a probe's step
            b.probing -= 1
        elif b.since_other >= self._interval(b):  # a probe's first step
            b.probing, b.since_other = self.probe_len - 1, 0
        # else: a step planned before the decision changed (launched ahead with its
        # predecessor's width): neither a probe nor the winner's

    def _interval(self, b: _Bucket) -> int:
        """Steps of the winner between probes: ``probe_every``, four times that where the loser
        yields under two thirds of the winner's tokens per second (a probe costs more, and
        the figures would have to move far to change the choice)."""
        spec_rate = max(self.gain.value, 1.0) / max(b.spec.value, 1e-12)
        plain_rate = 1.0 / max(b.plain.value, 1e-12)
        ratio = max(spec_rate, plain_rate) / max(min(spec_rate, plain_rate), 1e-12)
        return self.probe_every * (4 if ratio > 1.5 else 1)

    def _speculate(self, b: _Bucket) -> bool:
        """Whether a verify step yields more tokens per second than a plain one at ``b``."""
        return max(self.gain.value, 1.0) * b.plain.value >= b.spec.value

    def table(self) -> list[SpecDecision]:
        """Per bucket seen: both step times (ms, 0 where not measured) and the current choice."""
        return [
            SpecDecision(
                key,
                b.plain.value * 1e3,
                b.spec.value * 1e3,
                self._speculate(b)
                if b.spec.n >= self.warm and b.plain.n >= self.warm
                else self.drafts(key) > 0,
            )
            for key, b in sorted(self.buckets.items())
        ]
