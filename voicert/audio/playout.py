"""When the audio sent to a client plays: the server's model of a client's playout, sans-I/O.

A client plays each chunk of reply audio when it arrives, or when the chunk before it has finished
playing, whichever is later, in real time (a playout buffer). A reply made faster than it is
spoken arrives ahead of its playing and plays on long after the last chunk was sent; a reply made
slower than real time plays with gaps. The session holds the floor while its audio plays
(``agent/session.py``); the native door cuts the conversation at what had played when the caller
talked over it (``transport/spoken.PacingClock``); the echo guard lays its reference out by the
same rule, sample by sample (``speech/echo.py``).

All times are ``time.perf_counter_ns`` values passed in.
"""

from __future__ import annotations


class Playout:
    """One client's playout. :meth:`add` each chunk as it is sent; :meth:`played_ns` and
    :meth:`playing` answer for any time not before the last chunk was sent."""

    def __init__(self) -> None:
        self.end_ns = 0  # when the audio sent so far will have played
        self._start_ns = 0  # when the run of back-to-back audio playing last began
        self._before_ns = 0  # audio played in full before that run

    def add(self, duration_ns: int, sent_ns: int) -> int:
        """A chunk of ``duration_ns`` of audio sent at ``sent_ns``; returns when it starts playing."""
        start = max(sent_ns, self.end_ns)
        if start > self.end_ns:  # a gap: the run before it has played out
            self._before_ns += self.end_ns - self._start_ns
            self._start_ns = start
        self.end_ns = start + duration_ns
        return start

    def playing(self, now_ns: int) -> bool:
        return now_ns < self.end_ns

    def played_ns(self, now_ns: int) -> int:
        """How much of the audio added has played by ``now_ns``."""
        return self._before_ns + max(0, min(now_ns, self.end_ns) - self._start_ns)

    def stop(self) -> None:
        """The client stops playing what it holds (the agent was interrupted or cancelled)."""
        self.end_ns = self._start_ns = self._before_ns = 0
