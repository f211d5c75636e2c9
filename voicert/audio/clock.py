"""A session's audio clock: where the caller's audio timeline began on this server's clock, and
how late each frame of it is handled against that.

A caller's microphone or phone line makes audio in real time: the frame that ends at position
``t`` of the session's audio was there to send ``t`` after the audio began. When the server falls
behind (the event loop, the worker, the VAD or the speech host: anything that keeps the door's
reader from the socket) frames wait in the socket and its buffers, and every clock that starts
when a frame is *handled* starts late by as much. :class:`AudioClock` measures that wait as the
frame's *ingest lag*: how much later than the audio timeline allows it was handled.

The origin is the earliest start that the frames handled so far allow (a frame is never handled
before it was made). A caller who stops sending (between turns, muted, a text turn) breaks the
timeline, so the door says when its reader waited for the caller (:meth:`AudioClock.idle`): the
next frame was handled as it came, and the timeline is anchored on it again. While the reader has
frames waiting it never idles, so a backlog shows as lag until it drains.

Pure: no clock of its own, no I/O (tests/audio/test_clock.py).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class AudioClock:
    origin_ns: int | None = None  # where the audio timeline began, on the server's clock
    position_ns: int = 0  # the end of the audio handled so far, on the timeline
    lag_ns: int = 0  # the last frame's ingest lag
    _anchor: bool = True  # the next frame anchors the timeline (the reader waited for it)

    def idle(self) -> None:
        """The door's reader waited for the caller before its next message: that frame is
        handled as it arrives (a pause in the caller's audio ends the old timeline)."""
        self._anchor = True

    def frame(self, duration_ns: int, handled_ns: int) -> int:
        """A frame of ``duration_ns`` of the caller's audio, handled at ``handled_ns``; returns
        its ingest lag (ns, >= 0): how long after its last sample was made it was handled."""
        self.position_ns += duration_ns
        implied = handled_ns - self.position_ns  # the origin, were this frame on time
        if self.origin_ns is None or self._anchor or implied < self.origin_ns:
            self.origin_ns = implied
        self._anchor = False
        self.lag_ns = handled_ns - (self.origin_ns + self.position_ns)
        return self.lag_ns

    def made_ns(self, handled_ns: int, lag_ns: int | None = None) -> int:
        """When the caller made the audio handled at ``handled_ns`` with ``lag_ns`` of lag
        (default: the last frame's)."""
        return handled_ns - (self.lag_ns if lag_ns is None else lag_ns)
