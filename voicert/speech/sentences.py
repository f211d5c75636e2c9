"""Cut a streamed reply into speakable pieces as its tokens arrive. Pure Python, no I/O.

A piece ends at a sentence end (``.``, ``!``, ``?``, ``…`` followed by a space or a newline) that is
not an abbreviation or a decimal point, or at a line break. To get the first audio out sooner, the
*first* piece of a reply may also end at a clause break (``,`` ``;`` ``:`` or a dash) once it holds
``first_clause_chars`` characters, and, with ``first_piece_words``, after that many words when no
break has come (a voice that makes a piece's audio in one pass, as Piper does, speaks sooner);
later pieces wait for whole sentences, which sound better.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# Words whose trailing period does not end a sentence ("Dr. Smith", "e.g. this").
ABBREVIATIONS = frozenset(
    {
        "mr",
        "mrs",
        "ms",
        "dr",
        "prof",
        "sr",
        "jr",
        "st",
        "vs",
        "etc",
        "e.g",
        "i.e",
        "approx",
        "no",
        "inc",
        "ltd",
        "co",
        "mt",
        "ft",
        "a.m",
        "p.m",
        "u.s",
        "u.k",
    }
)
_SENTENCE_END = re.compile(r"([.!?…]+[\"')\]]*)(\s+)")
_CLAUSE_END = re.compile(r"([,;:]|\s[-–—])(\s+)")
_WORD = re.compile(r"\S+(?=\s)")  # a word with the space after it already here


def _is_abbreviation(text: str, dot: int) -> bool:
    """True when the period at ``text[dot]`` closes an abbreviation, an initial or a number."""
    start = dot
    while start > 0 and (text[start - 1].isalnum() or text[start - 1] == "."):
        start -= 1
    word = text[start:dot].lower()
    if word in ABBREVIATIONS or (len(word) == 1 and text[start].isupper()):  # "J. Smith"
        return True
    return word.isdigit() and dot + 1 < len(text) and text[dot + 1].isdigit()


@dataclass(slots=True)
class SentenceSplitter:
    """Feed text deltas with :meth:`push`; it returns the pieces completed so far. :meth:`flush`
    returns what is left at the end of the reply. Pieces are stripped and never empty."""

    first_clause_chars: int = 24
    first_piece_words: int = 0  # the first piece may end after this many words (0: off)
    _buf: str = ""
    _pieces: int = field(default=0)

    def push(self, delta: str) -> list[str]:
        self._buf += delta
        out: list[str] = []
        while True:
            cut = self._find_cut()
            if cut is None:
                return out
            piece, self._buf = self._buf[:cut].strip(), self._buf[cut:].lstrip()
            if piece:
                out.append(piece)
                self._pieces += 1

    def flush(self) -> list[str]:
        piece, self._buf = self._buf.strip(), ""
        if piece:
            self._pieces += 1
            return [piece]
        return []

    def _find_cut(self) -> int | None:
        buf = self._buf
        newline = buf.find("\n")
        for m in _SENTENCE_END.finditer(buf):
            if newline != -1 and newline < m.start():
                break
            if m.group(1)[0] == "." and len(m.group(1)) == 1 and _is_abbreviation(buf, m.start(1)):
                continue
            return m.end(1)
        if newline != -1:
            return newline + 1
        if self._pieces == 0 and len(buf) >= self.first_clause_chars:
            for m in _CLAUSE_END.finditer(buf):
                if m.start() >= self.first_clause_chars // 2:
                    return m.end(1)
        if self._pieces == 0 and self.first_piece_words > 0:
            for i, m in enumerate(_WORD.finditer(buf), 1):
                if i == self.first_piece_words:
                    return m.end()
        return None
