"""Incremental detokenization: token ids in, stable text deltas out."""

from __future__ import annotations


class IncrementalDetokenizer:
    """Turns a growing id list into text deltas, holding back an incomplete UTF-8 character (shown
    by the tokenizer as U+FFFD) until the token that completes it arrives.

    Each push decodes only a short window: the tokens since the last delta plus the ones of the
    delta before (as context, so that a word's leading space and multi-token characters decode as
    they would in the whole text). Its text is the difference between the window with and without
    the new tokens. So a reply of N tokens costs O(N) decoding, not O(N^2) as re-decoding the whole
    reply for every token would; the concatenated deltas equal decoding the whole id list
    (tests/engine/test_detok.py)."""

    def __init__(self, tokenizer, skip_special_tokens: bool = True) -> None:
        self.tok = tokenizer
        self.skip = skip_special_tokens
        self.ids: list[int] = []
        self.text = ""
        self._prefix = 0  # window start: the tokens of the delta before the last one
        self._read = 0  # tokens already turned into text

    def push(self, token_id: int) -> str:
        self.ids.append(token_id)
        before = self.tok.decode(self.ids[self._prefix : self._read], skip_special_tokens=self.skip)
        after = self.tok.decode(self.ids[self._prefix :], skip_special_tokens=self.skip)
        if after.endswith("\ufffd") or len(after) <= len(before) or not after.startswith(before):
            return ""  # an incomplete character, or nothing new yet: widen the window next time
        delta = after[len(before) :]
        self._prefix, self._read = self._read, len(self.ids)
        self.text += delta
        return delta
