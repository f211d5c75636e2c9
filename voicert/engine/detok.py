"""Incremental detokenization: token ids in, stable text deltas out."""

from __future__ import annotations


class IncrementalDetokenizer:
    """Decodes a growing id list and returns only the new text, holding back an incomplete UTF-8
    character (shown by the tokenizer as U+FFFD) until the token that completes it arrives."""

    def __init__(self, tokenizer, skip_special_tokens: bool = True) -> None:
        self.tok = tokenizer
        self.skip = skip_special_tokens
        self.ids: list[int] = []
        self.text = ""

    def push(self, token_id: int) -> str:
        self.ids.append(token_id)
        full = self.tok.decode(self.ids, skip_special_tokens=self.skip)
        if full.endswith("\ufffd"):
            return ""
        delta = full[len(self.text):] if full.startswith(self.text) else ""
        self.text = full
        return delta
