"""Live partial transcripts: LocalAgreement-2 over successive decodes of a growing utterance.

A word becomes *stable* once two consecutive hypotheses agree on it (and on everything before it);
stable text only ever grows. Pure Python, no I/O."""

from __future__ import annotations

import string

_STRIP = str.maketrans("", "", string.punctuation)


def _norm(word: str) -> str:
    return word.lower().translate(_STRIP)


class LocalAgreement:
    def __init__(self) -> None:
        self.stable: list[str] = []
        self._previous: list[str] = []  # the last hypothesis after the stable words

    def update(self, hypothesis: str) -> tuple[str, str]:
        """Feed the latest decode of the whole utterance; returns (stable, unstable) text."""
        words = hypothesis.split()
        k = len(self.stable)
        # Whisper may re-spell words already stable; stable text never changes, so align by count
        tail = words[k:]
        agreed = 0
        for a, b in zip(tail, self._previous):
            if _norm(a) != _norm(b):
                break
            agreed += 1
        self.stable += tail[:agreed]
        self._previous = tail[agreed:]
        return " ".join(self.stable), " ".join(self._previous)
