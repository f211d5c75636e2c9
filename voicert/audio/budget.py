"""How much audio a session may take: on average ``rate`` seconds of audio per second of the
clock (2: twice real time, room for a client catching up after a stall), in bursts of at most
``burst_s`` seconds (a client may send a recording at once). Pure: the caller gives the clock."""

from __future__ import annotations


class AudioBudget:
    """A token bucket whose tokens are seconds of audio. ``rate`` 0: no limit."""

    def __init__(self, rate: float, burst_s: float) -> None:
        self.rate = rate
        self.burst_s = burst_s
        self._level = burst_s
        self._at: float | None = None
        self.dropped_s = 0.0  # audio refused so far

    def take(self, seconds: float, now: float) -> bool:
        """Whether ``seconds`` of audio arriving at ``now`` (seconds, monotonic) fit; a frame
        that does not is refused whole and counted in ``dropped_s``."""
        if self.rate <= 0:
            return True
        if self._at is not None:
            self._level = min(self.burst_s, self._level + (now - self._at) * self.rate)
        self._at = now
        if seconds <= self._level:
            self._level -= seconds
            return True
        self.dropped_s += seconds
        return False
