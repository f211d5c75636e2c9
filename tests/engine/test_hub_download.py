"""``--llm org/name``: a Hugging Face hub repo is downloaded through huggingface_hub (against a local
stand-in hub, tests/engine/hub_standin.py) and served; a GGUF-only repo gives one GGUF file; a repo
the hub lacks, and a hub that cannot be reached, are one-line config errors naming what to pass."""

from __future__ import annotations

import shutil

import pytest
import torch

from tests.engine.hub_standin import HubStandIn
from voicert.config import ConfigError, cache_dir, load_config
from voicert.core.chat import ChatMessage
from voicert.core.llm import GenerationRequest
from voicert.engine.loader import _pick_gguf, download_llm, is_repo_id, resolve_llm


@pytest.fixture(scope="module")
def tiny_repo(tmp_path_factory):
    """A random-weight checkpoint of a real architecture (Llama, 2 layers, hidden 64) with the
    embedded model's tokenizer: what a hub repo of safetensors holds."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    embedded = resolve_llm("embedded", cache_dir(load_config(environ={}).models))
    tok = AutoTokenizer.from_pretrained(embedded)
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    root = tmp_path_factory.mktemp("repo")
    LlamaForCausalLM(cfg).save_pretrained(root, safe_serialization=True)
    tok.save_pretrained(root)
    gguf_repo = tmp_path_factory.mktemp("gguf")
    for name in ("m-F16.gguf", "m-Q4_K_M.gguf", "m-Q8_0.gguf"):
        (gguf_repo / name).write_bytes(b"GGUF" + name.encode())
    return root, gguf_repo


@pytest.fixture
def hub(tiny_repo, tmp_path, monkeypatch):
    import huggingface_hub.constants as constants

    root, gguf_repo = tiny_repo
    standin = HubStandIn({"acme/tiny-llama": root, "acme/tiny-gguf": gguf_repo})
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)
    monkeypatch.setenv("HF_ENDPOINT", standin.url)
    yield standin
    standin.close()


def test_a_repo_id_is_told_from_a_path(tmp_path):
    assert is_repo_id("Qwen/Qwen2.5-1.5B-Instruct") and is_repo_id("acme/tiny-llama")
    assert not is_repo_id("./models/x") and not is_repo_id("a/b/c") and not is_repo_id("embedded")
    (tmp_path / "org").mkdir()
    (tmp_path / "org" / "name").mkdir()
    assert not is_repo_id(str(tmp_path / "org" / "name"))


def test_a_safetensors_repo_is_downloaded_and_served(hub, tmp_path):
    from voicert.engine.build import build_core
    from voicert.engine.settings import EngineConfig

    model_dir = resolve_llm("acme/tiny-llama", tmp_path)
    assert (model_dir / "config.json").is_file() and list(model_dir.glob("*.safetensors"))
    assert any("resolve" in s and s.endswith("model.safetensors") for s in hub.seen)
    core = build_core(str(model_dir), EngineConfig(num_blocks=64, torchscript=False))
    core.add(GenerationRequest("r", [ChatMessage("user", "Hi")], 4, ignore_eos=True))
    tokens = []
    while core.has_work():
        tokens += [o.token_id for o in core.step() if o.finish_reason is None]
    assert len(tokens) == 4
    seen = len(hub.seen)
    assert resolve_llm("acme/tiny-llama", tmp_path) == model_dir  # from the cache
    assert all("resolve" not in s for s in hub.seen[seen:])


def test_a_gguf_only_repo_gives_its_preferred_file(hub):
    assert download_llm("acme/tiny-gguf").name == "m-Q8_0.gguf"
    assert _pick_gguf(["a-F16.gguf", "a-Q4_K_M.gguf"]) == "a-Q4_K_M.gguf"
    assert _pick_gguf(["b.gguf", "a.gguf"]) == "a.gguf"


def test_a_repo_the_hub_lacks_is_a_config_error(hub):
    with pytest.raises(ConfigError, match="acme/nothing is not on the Hugging Face hub"):
        resolve_llm("acme/nothing", cache_dir(load_config(environ={}).models))


def test_an_unreachable_hub_says_what_to_pass(monkeypatch, tmp_path):
    import huggingface_hub.constants as constants

    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(ConfigError) as err:
        download_llm("acme/tiny-llama")
    assert "cannot download acme/tiny-llama" in str(err.value) and "cannot be reached" in str(
        err.value
    )
    assert "Pass --llm PATH" in str(err.value) and "\n" not in str(err.value)
    shutil.rmtree(tmp_path / "hub", ignore_errors=True)


def test_serve_checks_a_hub_model_before_anything_slow_loads(monkeypatch, tmp_path):
    """An unreachable hub is said by the early model check, not after the ASR and VAD load."""
    import dataclasses

    import huggingface_hub.constants as constants

    from voicert.config import Config
    from voicert.server.app import check_models

    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    cfg = Config()
    cfg = dataclasses.replace(cfg, models=dataclasses.replace(cfg.models, llm="acme/tiny-llama"))
    with pytest.raises(ConfigError, match="cannot be reached"):
        check_models(cfg)
