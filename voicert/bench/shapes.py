"""Random-weight model shapes for the benches and tests (RANDOM WEIGHTS: timing only): the HF
config dicts of real architectures, and a tokenizer that has no text."""

from __future__ import annotations

SHAPES = {
    "llama-1b-random": dict(
        vocab_size=128256,
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=64,
        rms_norm_eps=1e-5,
        rope_theta=500000.0,
        max_position_embeddings=131072,
        tie_word_embeddings=True,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    ),
    "llama-8b-random": dict(
        vocab_size=128256,
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        rms_norm_eps=1e-5,
        rope_theta=500000.0,
        max_position_embeddings=131072,
        tie_word_embeddings=False,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    ),
    "smollm2-random": dict(
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        head_dim=64,
        rms_norm_eps=1e-5,
        rope_theta=100000.0,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
    ),
    "qwen3-8b-random": dict(
        model_type="qwen3",
        vocab_size=151936,
        hidden_size=4096,
        intermediate_size=12288,
        num_hidden_layers=36,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        rms_norm_eps=1e-6,
        rope_theta=1000000.0,
        max_position_embeddings=40960,
        tie_word_embeddings=False,
    ),
}


def shape_config(name: str) -> dict:
    """The HF config dict of a random-weight shape of :data:`SHAPES` (Llama unless the shape
    names its ``model_type``, e.g. Qwen3's per-head q/k norms)."""
    return {"model_type": "llama", **SHAPES[name]}


class NullTokenizer:
    """For random-weight models: no text, ids only."""

    def __init__(self, vocab: int) -> None:
        self.eos_token_id = None
        self.vocab = vocab

    def get_vocab(self) -> dict:
        return {}

    def decode(self, ids, skip_special_tokens=True) -> str:
        return ""
