"""The model registry: checkpoints load by their config's model_type; an unsupported one is
refused with the supported types named."""

import json

import pytest
import torch

from voicert.engine.models.llama import LlamaModel
from voicert.engine.models.registry import architecture_for, load_model


def test_llama_family_model_types_share_one_architecture():
    assert {architecture_for(t).name for t in ("llama", "mistral", "qwen2", "qwen3", "phi3")} == {
        "llama"
    }
    assert architecture_for("gemma2").name == architecture_for("gemma3_text").name == "gemma"


def test_an_unsupported_model_type_names_the_supported_ones(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mamba"}))
    with pytest.raises(ValueError, match="'mamba' is not supported.*llama"):
        load_model(tmp_path)


def test_a_directory_without_config_is_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_model(tmp_path)


def test_the_embedded_checkpoint_loads_through_the_registry():
    from voicert.config import cache_dir, load_config
    from voicert.engine.loader import resolve_llm

    model = load_model(
        resolve_llm("embedded", cache_dir(load_config(environ={}).models)), torch.float32
    )
    assert isinstance(model, LlamaModel) and model.cfg.num_layers == 30
