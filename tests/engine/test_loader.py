import pytest

from voicert.config import ConfigError, cache_dir, load_config
from voicert.engine.loader import MARKER, converted_dir, embedded_gguf, is_hf_dir, resolve_llm


def test_embedded_gguf_is_found_without_importing_the_package():
    path = embedded_gguf()
    assert path.suffix == ".gguf" and path.stat().st_size > 50_000_000


def test_embedded_resolves_to_a_converted_checkpoint(services):
    cfg = load_config(environ={})
    out = resolve_llm("embedded", cache_dir(cfg.models))
    assert out == converted_dir(embedded_gguf(), cache_dir(cfg.models))
    assert (out / MARKER).is_file() and is_hf_dir(out)
    assert (out / "tokenizer.json").is_file()
    # an HF checkpoint dir given by config loads as it is
    assert resolve_llm(str(out), cache_dir(cfg.models)) == out


def test_bad_llm_specs_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        resolve_llm(str(tmp_path / "nope"), tmp_path)
    with pytest.raises(ConfigError, match="neither an HF checkpoint dir"):
        resolve_llm(str(tmp_path), tmp_path)


def test_a_conversion_left_by_a_process_that_is_gone_is_cleared_and_a_live_ones_kept(tmp_path):
    import os

    from voicert.engine.loader import remove_stale_temps

    out = tmp_path / "SmolLM2-x"
    gone, live = tmp_path / "SmolLM2-x.tmp999999999", tmp_path / f"SmolLM2-x.tmp{os.getpid()}"
    for d in (gone, live):
        d.mkdir()
        (d / "model.safetensors").write_bytes(b"half")
    remove_stale_temps(out)
    assert not gone.exists() and live.exists()


def test_a_gguf_that_dequantizes_to_nan_is_refused_naming_the_tensor(tmp_path):
    """A damaged GGUF (e.g. parts joined out of order: blocks whose float16 scale reads as NaN)
    is refused when converted, naming the first bad tensor, rather than served as a model of
    NaN weights."""
    import torch

    from voicert.config import ConfigError
    from voicert.engine.loader import _refuse_non_finite

    good = {"model.embed_tokens.weight": torch.ones(4, 3), "ids": torch.arange(3)}
    _refuse_non_finite(good, tmp_path / "m.gguf")
    bad = dict(
        good, **{"model.layers.0.self_attn.k_proj.weight": torch.tensor([1.0, float("nan")])}
    )
    with pytest.raises(ConfigError, match=r"1 NaN / infinite values in model.layers.0.self_attn"):
        _refuse_non_finite(bad, tmp_path / "m.gguf")
