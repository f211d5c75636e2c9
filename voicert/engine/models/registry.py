"""Which architectures the engine runs, keyed by the ``model_type`` of an HF ``config.json``.

An architecture is one file in this package (its config, its model built from ``layers.py``, the
conversion of its checkpoint's weights) and one entry in :data:`ARCHITECTURES`; its tests go in
tests/engine (greedy equal to transformers, cached == uncached, batched == unbatched).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from voicert.engine.models import gemma, llama
from voicert.engine.models.base import Model


@dataclass(frozen=True, slots=True)
class Architecture:
    name: str
    model_types: tuple[str, ...]  # HF config.json "model_type" values it serves
    load: Callable[[Path, torch.dtype, str | torch.device], Model]  # checkpoint dir -> model


ARCHITECTURES: tuple[Architecture, ...] = (
    Architecture("llama", llama.MODEL_TYPES, llama.load_llama),
    Architecture("gemma", gemma.MODEL_TYPES, gemma.load_gemma),
)


def architecture_for(model_type: str) -> Architecture:
    """The architecture serving ``model_type``; ValueError naming the supported ones otherwise."""
    for arch in ARCHITECTURES:
        if model_type in arch.model_types:
            return arch
    known = ", ".join(t for a in ARCHITECTURES for t in a.model_types)
    raise ValueError(f"model_type {model_type!r} is not supported (supported: {known})")


def load_model(
    model_dir: str | Path, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"
) -> Model:
    """The model of an HF checkpoint dir (config.json + *.safetensors), by its model_type."""
    model_dir = Path(model_dir)
    config = model_dir / "config.json"
    if not config.is_file():
        raise FileNotFoundError(f"{model_dir}: no config.json (not an HF checkpoint directory)")
    kind = json.loads(config.read_text()).get("model_type", "llama")
    return architecture_for(kind).load(model_dir, dtype, device)
