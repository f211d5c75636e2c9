"""Admission at the door: new sessions are refused before the callers already in degrade.

A server that takes more callers than it can serve does not fail at once: it falls behind, in
one of two ways. Its front end falls behind the audio: frames wait in the sockets and every
turn's end is decided late (audio/clock.py measures that wait as each frame's *ingest lag*; the
event loop's own lag is the same thing seen from a probe). Or its recogniser and engine fall
behind the turns: transcripts and first tokens queue, and each turn's TTFT, measured from the
caller's audio, passes the budget (``telemetry.budget_ms``). :class:`Admission` watches both,
each sampling interval (telemetry/sampler.py): the worst lag of the interval, and the median TTFT
of the turns of the last ``WINDOW_S`` seconds. When either passes its limit the door closes: new
sessions get 503 with Retry-After at the handshake on every door, and ``/readyz`` answers 503, so
that a load balancer sends callers to another replica. The sessions already in keep their place.

It opens again once both have stayed under half their limits for ``server.admission_calm_s``,
but not to everyone at once: the number of sessions it closed at, less one, becomes a ceiling,
raised by one each further calm interval, so that a server at its capacity takes callers back
one at a time instead of swinging between overload and refusal. An empty server always takes a
session: there is nobody to degrade.

Sans-I/O: the sampler passes its figures in with the time; the doors ask :meth:`refusal`
(tests/server/test_admission.py drives it on a fake clock).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

WINDOW_S = 10.0  # the turns whose TTFT counts: those finished this recently
MIN_TURNS = 3  # fewer in the window: the TTFT signal says nothing


@dataclass(slots=True)
class Admission:
    lag_ms: float  # the ingest or loop lag that closes the door (server.admission_lag_ms)
    calm_s: float  # how long both signals stay under half before the door opens again
    budget_ms: float = float("inf")  # the median TTFT that closes it (telemetry.budget_ms)
    closed: bool = False
    ceiling: int | None = None  # sessions taken at most, while the door reopens after a close
    why: str = ""  # what closed it, in words
    _calm_since: float | None = None
    _ttfts: deque[tuple[float, float]] = field(default_factory=deque)  # (when, TTFT ms)

    def observe(
        self, now_s: float, lag_ms: float, sessions: int, ttfts_ms: tuple[float, ...] = ()
    ) -> None:
        """One sampling interval at ``now_s``: its worst lag (ms), the TTFTs (ms) of the turns
        it finished, with ``sessions`` sessions in."""
        self._ttfts.extend((now_s, t) for t in ttfts_ms)
        while self._ttfts and self._ttfts[0][0] < now_s - WINDOW_S:
            self._ttfts.popleft()
        ttft = self._median_ttft()
        if lag_ms >= self.lag_ms or (ttft is not None and ttft > self.budget_ms):
            self.why = (
                f"audio handled {lag_ms:.0f} ms late (server.admission_lag_ms {self.lag_ms:g})"
                if lag_ms >= self.lag_ms
                else f"first tokens {ttft:.0f} ms after the turn ended, median of the last "
                f"{len(self._ttfts)} turns (telemetry.budget_ms {self.budget_ms:g})"
            )
            self._behind(sessions)
            return
        calm = lag_ms <= self.lag_ms / 2 and (ttft is None or ttft <= self.budget_ms / 2)
        if not calm:
            self._calm_since = None  # not calm yet, nor behind: as it is
            return
        if self._calm_since is None:
            self._calm_since = now_s
            return
        if now_s - self._calm_since < self.calm_s:
            return
        self._calm_since = now_s  # each further calm interval counts again
        if self.closed:
            self.closed = False
        elif self.ceiling is not None:
            self.ceiling += 1
            if sessions < self.ceiling - 1:
                self.ceiling = None  # far from it again: no ceiling left to keep

    def _behind(self, sessions: int) -> None:
        if not self.closed:
            self.closed = True
            self.ceiling = max(sessions - 1, 1)
        elif self.ceiling is not None and sessions <= self.ceiling:
            self.ceiling = max(sessions - 1, 1)  # still behind with fewer: lower it
        self._calm_since = None

    def _median_ttft(self) -> float | None:
        if len(self._ttfts) < MIN_TURNS:
            return None
        values = sorted(t for _, t in self._ttfts)
        return values[len(values) // 2]

    def refusal(self, sessions: int) -> str | None:
        """Why a new session is refused now, with ``sessions`` in; None: it is taken."""
        if sessions == 0:
            return None
        if self.closed:
            return f"overloaded: {self.why}"
        if self.ceiling is not None and sessions >= self.ceiling:
            return f"recovering from overload: {self.ceiling} sessions at most for now"
        return None
