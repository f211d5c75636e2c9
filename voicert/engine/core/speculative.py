"""Speculative decoding that is lossless for greedy: propose draft tokens, verify them all in one
target forward, keep the longest prefix the target agrees with plus the target's own next token."""

from __future__ import annotations


def ngram_propose(
    tokens: list[int], k: int, max_n: int = 4, min_n: int = 1, window: int = 1024
) -> list[int]:
    """Prompt lookup: find the most recent earlier occurrence of the last n tokens (longest n first,
    within the last ``window`` tokens) and propose the (up to) ``k`` tokens that followed it."""
    if k <= 0:
        return []
    seq = tokens[-window:]
    size = len(seq)
    for n in range(min(max_n, size - 1), min_n - 1, -1):
        suffix = seq[size - n :]
        first = suffix[0]
        # scan right to left for an earlier match that is followed by at least one token
        for i in range(size - n - 1, -1, -1):
            if seq[i] == first and seq[i : i + n] == suffix:
                draft = seq[i + n : i + n + k]
                if draft:
                    return draft
    return []


def accept_greedy(draft: list[int], target: list[int]) -> list[int]:
    """draft: d_1..d_k; target: the target's argmax after the last accepted token and after each
    draft token (k + 1 values). Returns the tokens to append: the drafts the target would have
    produced itself, then the target's token at the first disagreement (or its bonus token).

    Greedy decoding emits target[0] next. If d_1 == target[0], the target's choice after d_1 is
    target[1], and so on: every returned token is exactly what plain greedy would emit."""
    out = []
    for i, d in enumerate(draft):
        if d != target[i]:
            break
        out.append(d)
    out.append(target[len(out)])
    return out
