"""Speaking into a phone call, for any telephony provider: sans-I/O.

The reply's audio goes out as fixed-size media frames (20 ms of 8 kHz G.711), a *mark* after each
spoken piece and one at the end of the reply; the provider echoes a mark once the audio before it
has played, so what is still queued at the provider is known. When the caller starts talking while
reply audio is still queued or playing, a *clear* drops it at the provider, and chunks of that reply
still on their way are dropped here and get no end mark (an end mark would read as "played to the
end").

:class:`Playback` keeps that state and returns the frames to send; a provider supplies only a
``Serializer`` (its message formats; ``voicert.core.telephony``): ``protocol/twilio.py``,
``protocol/telnyx.py`` and ``protocol/plivo.py`` each have one.
"""

from __future__ import annotations

from voicert.core.telephony import Serializer


class Playback:
    def __init__(self, serializer: Serializer) -> None:
        self.ser = serializer
        self.pending = bytearray()  # reply audio not yet a whole frame
        self.marks: list[str] = []  # marks sent whose audio the provider has not finished playing
        self.unmarked = False  # audio sent after the last mark: it may still be playing
        self.pieces = 0  # spoken pieces of the reply in progress
        self.cleared_before = 0  # replies of turns below this id were cleared (barge-in)
        self.turn = -1  # the reply whose audio was sent last
        self.texts: list[str] = []  # its pieces' texts, in order
        self.played = 0  # how many of its pieces the provider reported played (echoed marks)
        self.cut: tuple[int, list[str]] | None = None  # (turn, pieces heard) of a cleared reply

    def audio(self, turn_id: int, seq: int, text: str, audio: bytes) -> list[str]:
        """A chunk of reply speech (``text``: the piece it starts, "" within a piece)."""
        if turn_id < self.cleared_before:
            return []  # a chunk already on its way when the caller talked over the reply
        if turn_id != self.turn:
            self.turn, self.texts, self.played = turn_id, [], 0
        out = []
        if text and seq > 0:
            out.append(self._mark(f"turn{turn_id}-piece{self.pieces}"))
        if text:
            self.pieces += 1
            self.texts.append(text)
        return out + self._play(audio)

    def reply_done(self, turn_id: int) -> list[str]:
        """The reply's last audio was handed over: flush it and mark its end."""
        if turn_id < self.cleared_before:  # cut off and cleared: nothing left to play
            self.pieces = 0
            return []
        out = self._flush()
        out.append(self._mark(f"turn{turn_id}-end"))
        self.pieces = 0
        return out

    def speech_started(self, turn_id: int) -> list[str]:
        """The caller started talking (utterance ``turn_id``): if our audio is still queued or
        playing at the provider, clear it and drop what of it is still on its way."""
        if not self.playing:
            return []
        self.cut = (self.turn, self.texts[: self.played])
        self.pending.clear()
        self.marks.clear()
        self.unmarked = False
        self.cleared_before = turn_id
        return [self.ser.clear()]

    def mark_played(self, name: str) -> None:
        """The provider echoed a mark: it, and everything before it, has played."""
        if name in self.marks:
            del self.marks[: self.marks.index(name) + 1]
            turn, _, piece = name.partition("-piece")
            if turn == f"turn{self.turn}" and piece.isdigit():
                self.played = max(self.played, int(piece))  # the pieces before this mark
            elif name == f"turn{self.turn}-end":
                self.played = len(self.texts)

    def heard(self, turn_id: int) -> list[str] | None:
        """The pieces of reply ``turn_id`` the caller heard before they talked over it and it
        was cleared (pieces whose audio the provider reported played); None when it was not cut
        off that way."""
        if self.cut is None or self.cut[0] != turn_id:
            return None
        return self.cut[1]

    @property
    def playing(self) -> bool:
        """Reply audio may be queued or playing at the provider: marks not yet echoed, or audio
        sent after the last mark (the first piece of a reply has no mark before the next one)."""
        return bool(self.marks or self.pending or self.unmarked)

    def _play(self, audio: bytes) -> list[str]:
        self.pending += audio
        n = self.ser.frame_bytes
        whole = len(self.pending) - len(self.pending) % n
        out = [self.ser.media(bytes(self.pending[i : i + n])) for i in range(0, whole, n)]
        del self.pending[:whole]
        self.unmarked = self.unmarked or bool(out)
        return out

    def _flush(self) -> list[str]:
        if not self.pending:
            return []
        self.pending += self.ser.silence * (self.ser.frame_bytes - len(self.pending))
        return self._play(b"")

    def _mark(self, name: str) -> str:
        self.marks.append(name)
        self.unmarked = False  # the audio sent so far comes before this mark
        return self.ser.mark(name)
