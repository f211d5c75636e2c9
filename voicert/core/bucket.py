"""The one rate limit there is: a token bucket on a clock the caller gives. The doors take one
token a message (``server.max_messages_per_s``); a session takes its audio's seconds
(``server.max_audio_rate``). Pure: no clock of its own, no I/O."""

from __future__ import annotations


class TokenBucket:
    """``rate`` tokens a second on average, bursts of up to ``burst``; ``rate`` 0: no limit."""

    def __init__(self, rate: float, burst: float) -> None:
        self.rate = rate
        self.burst = burst
        self.tokens = burst
        self.last: float | None = None

    def take(self, amount: float, now: float) -> bool:
        """Take ``amount`` tokens at monotonic time ``now`` (seconds); False, taking nothing,
        when there are fewer."""
        if self.rate <= 0:
            return True
        if self.last is not None:
            self.tokens = min(self.burst, self.tokens + (now - self.last) * self.rate)
        self.last = now
        if amount <= self.tokens:
            self.tokens -= amount
            return True
        return False

    def allow(self, now: float) -> bool:
        """Take one token (one message)."""
        return self.take(1.0, now)
