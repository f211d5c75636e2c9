"""Semantic end of turn from the words: does a transcript stop in the middle of a phrase?

A cue, not a model: English sentences do not end on an article, a preposition, a conjunction, a
possessive or an auxiliary, nor on a hesitation or a trailing "..." (which Whisper writes for speech
that trails off). "I'd like to book a table for" continues; "book a table for four" may be
complete. Pure and fast; the audio model (speech/smart_turn.py) judges the rest.
"""

from __future__ import annotations

import re

# words after which an English statement is (almost) never complete. Kept short on purpose: a word
# here that does end sentences ("so", "is", "in") would make those turns wait the maximum silence.
_CONTINUES = frozenset(
    [
        "a",
        "an",
        "the",
        "my",
        "your",
        "his",
        "her",
        "our",
        "their",
        "for",
        "to",
        "of",
        "at",
        "with",
        "from",
        "into",
        "onto",
        "than",
        "via",
        "per",
        "toward",
        "towards",
        "upon",
        "between",
        "without",
        "and",
        "or",
        "but",
        "nor",
        "because",
        "if",
        "when",
        "while",
        "although",
        "though",
        "unless",
        "whereas",
        "i",
        "we",
        "they",
        "he",
        "she",
        "i'm",
        "i'd",
        "i'll",
        "we're",
        "they're",
        "you're",
        "um",
        "uh",
        "er",
        "erm",
        "uhm",
    ]
)
_TRAILING = re.compile(r"(\.\.\.|…|-|,|;|:)\s*$")
_WORD = re.compile(r"[a-z0-9']+")  # a number is a word: "count from 1 to 5" ends on "5"


def continues(text: str) -> bool:
    """True when the transcript so far ends mid-phrase: its last word cannot end an English
    statement, or it trails off ("...", a dash, a comma). Empty text does not continue. A
    question mark does not rescue a dangling word: Whisper writes "from London to?" for a rising
    voice that has not finished (the price: "Where are you from?" waits the maximum)."""
    stripped = text.strip()
    if not stripped:
        return False
    if _TRAILING.search(stripped):
        return True
    words = _WORD.findall(stripped.lower().replace("’", "'"))
    return bool(words) and words[-1] in _CONTINUES


# what a listener says to show they follow, not to take the turn (whole utterances)
_BACKCHANNELS = frozenset(
    [
        "mm-hm",
        "mhm",
        "mm-hmm",
        "mm hmm",
        "mm",
        "hm",
        "hmm",
        "uh-huh",
        "uh huh",
        "um-hum",
        "yeah",
        "yep",
        "yes",
        "ok",
        "okay",
        "right",
        "sure",
        "alright",
        "all right",
        "i see",
        "got it",
        "cool",
        "nice",
        "great",
        "true",
        "exactly",
        "ah",
        "oh",
        "yeah yeah",
        "okay okay",
        "right right",
        "yes yes",
        "oh okay",
        "ah okay",
        "oh i see",
        "yeah okay",
        "okay yeah",
        "yeah right",
        "oh right",
        "mm-hm yeah",
        "uh-huh yeah",
        "sure sure",
        "makes sense",
        "that makes sense",
    ]
)
_NOT_WORD = re.compile(r"[^a-z' -]+")


_HUM = re.compile(r"^(u?h?m+(-?h?m+)*|h+m+|mhm+|uh-?huh)$")  # mm, mmm, mm-hm, hmm, mhm, uh-huh


def is_backchannel(text: str) -> bool:
    """True when the whole utterance is a backchannel ("Mm-hm.", "Mmm, mmm.", "Yeah, okay.",
    "I see"): the listener follows along. "Wait", "stop", "no", "uh-uh" (no) and anything longer
    are not."""
    words = " ".join(_NOT_WORD.sub(" ", text.lower().replace("’", "'")).split())
    if not words:
        return False
    return words in _BACKCHANNELS or all(_HUM.match(w) for w in words.split())
