"""Incremental detokenization over a sliding window equals decoding the whole reply at once."""

import random

import pytest

from voicert.engine.clients.detok import IncrementalDetokenizer

TEXTS = [
    "Hello, world! It's 3.14 — café naïve 日本語 🙂 , . ? don't",
    "The capital of France is Paris .",
    " spaced   out\n\nlines\t tabs",
]


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from voicert.config import cache_dir, load_config
    from voicert.engine.loader import resolve_llm

    return AutoTokenizer.from_pretrained(
        str(resolve_llm("embedded", cache_dir(load_config(environ={}).models)))
    )


def test_deltas_join_to_the_whole_decode_for_text_and_random_ids(tokenizer):
    rng = random.Random(0)
    for trial in range(200):
        if trial < 100:
            ids = tokenizer.encode(rng.choice(TEXTS) * rng.randint(1, 3), add_special_tokens=False)
        else:  # random ids: byte tokens that make and break multi-byte characters
            ids = [rng.randrange(tokenizer.vocab_size) for _ in range(40)]
        detok = IncrementalDetokenizer(tokenizer)
        joined = "".join(detok.push(t) for t in ids)
        whole = tokenizer.decode(ids, skip_special_tokens=True)
        if whole.endswith("\ufffd"):  # the last character is still incomplete: held back
            assert whole.startswith(joined)
        else:
            assert joined == whole


def test_an_incomplete_character_is_held_back_until_complete(tokenizer):
    ids = tokenizer.encode("🙂", add_special_tokens=False)
    assert len(ids) > 1  # byte-level: the emoji takes several tokens
    detok = IncrementalDetokenizer(tokenizer)
    deltas = [detok.push(t) for t in ids]
    assert deltas[:-1] == [""] * (len(ids) - 1) and deltas[-1] == "🙂"
