"""Prompts and stop tokens from a model's tokenizer and chat template."""

from __future__ import annotations

from voicert.engine.base import ChatMessage


def stop_token_ids(tokenizer, model_config) -> set[int]:
    """Ids that end a reply: the tokenizer's EOS, the generation config's EOS, and the usual
    end-of-turn markers of chat templates when the vocabulary has them."""
    ids: set[int] = set()
    for value in (tokenizer.eos_token_id, getattr(model_config, "eos_token_id", None)):
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(v for v in value if isinstance(v, int))
    vocab = tokenizer.get_vocab()
    for marker in ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>", "<|endoftext|>"):
        if marker in vocab:
            ids.add(vocab[marker])
    return ids


def build_prompt(tokenizer, messages: list[ChatMessage], budget: int) -> list[int]:
    """Chat-template ``messages`` into ids, dropping the oldest non-system turns until the prompt
    fits in ``budget`` tokens. The system prompt and the last user message always stay."""
    msgs = [{"role": m.role, "content": m.content} for m in messages]
    while True:
        ids = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True,
                                            return_dict=False)
        if hasattr(ids, "keys"):
            ids = ids["input_ids"]
        ids = list(ids)
        first = 1 if msgs and msgs[0]["role"] == "system" else 0
        if len(ids) <= budget or len(msgs) - first <= 1:
            return ids[-budget:]
        del msgs[first]
