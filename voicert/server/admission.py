"""Admission at the door: new sessions are refused before the callers already in degrade.

A server that takes more callers than it can serve in real time does not fail at once: it falls
behind. Frames wait in the sockets, every turn's end is decided late, and every caller waits for
it (audio/clock.py measures that wait as each frame's *ingest lag*). :class:`Admission` watches
the worst lag of each sampling interval, the sessions' ingest lag and the event loop's own
(telemetry/sampler.py), and closes the door when it passes ``server.admission_lag_ms``: new
sessions get 503 with Retry-After at the handshake on every door, and ``/readyz`` answers 503 so
that a load balancer sends callers to another replica. The sessions already in keep their place.

It opens again once the lag has stayed under half the limit for ``server.admission_calm_s``, but
not to everyone at once: the number of sessions it closed at, less one, becomes a ceiling, raised
by one each further calm interval, so that a server at its capacity takes callers back one at a
time instead of swinging between overload and refusal.

Sans-I/O: the sampler passes its figures in with the time; the doors ask :meth:`refusal`
(tests/server/test_admission.py drives it on a fake clock).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class Admission:
    lag_ms: float  # the lag that closes the door (server.admission_lag_ms)
    calm_s: float  # how long the lag stays under half of it before the door opens again
    closed: bool = False
    ceiling: int | None = None  # sessions taken at most, while the door reopens after a close
    last_lag_ms: float = 0.0
    _calm_since: float | None = None

    def observe(self, now_s: float, lag_ms: float, sessions: int) -> None:
        """The worst lag (ms) of the interval just sampled, at ``now_s``, with ``sessions``
        sessions in."""
        self.last_lag_ms = lag_ms
        if lag_ms >= self.lag_ms:
            if not self.closed:
                self.closed = True
                self.ceiling = max(sessions - 1, 1)
            elif self.ceiling is not None and sessions <= self.ceiling:
                self.ceiling = max(sessions - 1, 1)  # still behind with fewer: lower it
            self._calm_since = None
            return
        if lag_ms > self.lag_ms / 2:
            self._calm_since = None  # not calm yet, nor overloaded: as it is
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

    def refusal(self, sessions: int) -> str | None:
        """Why a new session is refused now, with ``sessions`` in; None: it is taken. A server
        with no session in always takes one: there is nobody to degrade."""
        if sessions == 0:
            return None
        if self.closed:
            return (
                f"overloaded: audio handled {self.last_lag_ms:.0f} ms late "
                f"(server.admission_lag_ms {self.lag_ms:g})"
            )
        if self.ceiling is not None and sessions >= self.ceiling:
            return f"recovering from overload: {self.ceiling} sessions at most for now"
        return None
