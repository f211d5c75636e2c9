"""What a listener has heard of a spoken reply: sans-I/O.

A :class:`SpokenReply` is the reply's speech as it was sent (when each piece of its text began, in
ms of audio); :meth:`SpokenReply.heard_chars` turns a playback position into how much of the
reply's text was heard. The Realtime door gets the position from the client
(``conversation.item.truncate``); the native door estimates it with :class:`PacingClock` (the
client plays audio as it arrives, in real time, and stops when the server interrupts the reply:
``audio/playout.py``); telephony uses the provider's marks
(``transport/telephony.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from voicert.audio.playout import Playout

BYTES_PER_SAMPLE = {"pcm16": 2, "f32": 4, "mulaw": 1, "alaw": 1}


def covered_chars(text: str, pieces: list[str]) -> int:
    """How many leading characters of a reply's ``text`` the spoken ``pieces`` (in order) cover."""
    pos = 0
    for piece in pieces:
        at = text.find(piece.strip(), pos)
        if at < 0:
            break
        pos = at + len(piece.strip())
    return pos


def bytes_per_ms(encoding: str, sample_rate: int) -> float:
    return BYTES_PER_SAMPLE[encoding] * sample_rate / 1000


@dataclass(slots=True)
class SpokenReply:
    """One reply's speech as sent: ``add`` each chunk (``text``: the piece it begins, or "")."""

    bytes_per_ms: float
    pieces: list[tuple[float, str]] = field(default_factory=list)  # (start ms, text)
    sent_ms: float = 0.0  # audio sent so far
    text: str = ""  # the reply's text, once done
    item_id: str = ""  # its conversation item, once done
    item_offset: int = 0  # where that item's text starts in ``text``
    cut_ms: float | None = None  # where the listener cut it off, if they did

    def add(self, audio: bytes, text: str) -> None:
        if text:
            self.pieces.append((self.sent_ms, text))
        self.sent_ms += len(audio) / self.bytes_per_ms

    def heard_chars(self, audio_end_ms: float) -> int:
        """How much of ``text`` was heard by ``audio_end_ms``: every piece whose audio had ended
        by then, and of the piece playing then, the share of its words its audio had reached."""
        heard, pos = 0, 0
        for i, (start, piece) in enumerate(self.pieces):
            piece = piece.strip()
            at = self.text.find(piece, pos)
            if at < 0 or start >= audio_end_ms:
                break
            end = self.pieces[i + 1][0] if i + 1 < len(self.pieces) else self.sent_ms
            pos = at + len(piece)
            if audio_end_ms >= end:
                heard = pos
                continue
            words = piece.split()
            n = int(len(words) * (audio_end_ms - start) / max(end - start, 1e-6))
            heard = at + len(" ".join(words[:n]))
            break
        return heard


class PacingClock:
    """The native door's estimate of playback: the client plays a reply's audio as it arrives,
    each chunk after the one before it, in real time (``audio/playout.Playout``, the session's
    model of the same playout). ``speech_started`` (the server interrupts the agent's speech for
    the caller's) marks how far it had played; the cut is applied when the reply is done as
    interrupted, or at once when it was all sent and still playing. All times are
    ``time.perf_counter_ns`` values passed in."""

    def __init__(self) -> None:
        self.reply: SpokenReply | None = None
        self.turn = -1
        self.playout = Playout()  # the reply's audio, as the client plays it

    def started(self, turn_id: int, bytes_per_ms_: float) -> None:
        self.reply, self.turn, self.playout = SpokenReply(bytes_per_ms_), turn_id, Playout()

    def audio(self, turn_id: int, audio: bytes, text: str, now_ns: int) -> None:
        if self.reply is None or turn_id != self.turn:
            return
        self.playout.add(round(len(audio) / self.reply.bytes_per_ms * 1_000_000), now_ns)
        self.reply.add(audio, text)

    def speech_started(self, now_ns: int) -> SpokenReply | None:
        """The server stops the agent's speech for the caller's (a barge-in): mark how much of
        the reply had played by this clock. While the reply is still being sent the cut waits for
        its end (:meth:`done`). Once it is done, all sent but still playing at the caller's end,
        the reply is returned: apply ``cut_ms`` now. None otherwise (nothing spoken yet, cut
        already, or played to its end)."""
        r = self.reply
        if r is None or not r.sent_ms or r.cut_ms is not None:
            return None
        played_ms = self.playout.played_ns(now_ns) / 1e6
        if not r.item_id:
            r.cut_ms = min(played_ms, r.sent_ms)
            return None
        if played_ms >= r.sent_ms:
            return None
        r.cut_ms = played_ms
        return r

    def done(
        self, turn_id: int, text: str, item_id: str, interrupted: bool, item_offset: int = 0
    ) -> SpokenReply | None:
        """The reply is done (``item_offset``: where its item's text starts in ``text``); returns
        it when the caller cut it off (apply ``cut_ms`` now)."""
        r = self.reply
        if r is None or turn_id != self.turn:
            return None
        r.text, r.item_id, r.item_offset = text, item_id, item_offset
        return r if interrupted and r.cut_ms is not None and item_id else None
