"""A random SmolLM2-shaped model (2 layers, seeded) with the embedded model's tokenizer: the engine
tests' adversary. Its greedy tokens are noise and its distributions wide, and exactness needs no
real weights."""

from __future__ import annotations

import torch

from voicert.bench.shapes import shape_config
from voicert.engine.build import build_core
from voicert.engine.core.engine_core import EngineCore
from voicert.engine.models.llama import LlamaConfig, random_llama
from voicert.engine.settings import EngineConfig


def random_parts() -> tuple[str, torch.nn.Module, object]:
    """(the embedded model's directory, a fresh random model seeded with 0, its tokenizer)."""
    from transformers import AutoTokenizer

    from voicert.config import cache_dir, load_config
    from voicert.engine.loader import resolve_llm

    model_dir = str(resolve_llm("embedded", cache_dir(load_config(environ={}).models)))
    torch.manual_seed(0)
    model = random_llama(
        LlamaConfig.from_hf(dict(shape_config("smollm2-random"), num_hidden_layers=2)),
        torch.float32,
        "cpu",
    )
    return model_dir, model, AutoTokenizer.from_pretrained(model_dir)


def random_core(parts: tuple | None = None, num_blocks: int = 256, **cfg) -> EngineCore:
    """An engine core on ``parts`` (fresh random parts if None), eager, with ``cfg`` on top."""
    model_dir, model, tok = parts or random_parts()
    return build_core(
        model_dir,
        EngineConfig(num_blocks=num_blocks, torchscript=False, **cfg),
        model=model,
        tokenizer=tok,
    )
