"""Building an engine from the config tree: one set of defaults (the ``llm`` section's), every
key carried, the other device's options off."""

import dataclasses

import pytest

from voicert.config import LlmConfig
from voicert.engine.settings import EngineConfig, engine_config


def test_the_engine_takes_every_llm_key_as_configured():
    llm = LlmConfig(
        max_batch=7,
        block_size=32,
        prefill_token_budget=64,
        spec_tokens=3,
        max_context_tokens=999,
        batch_window_ms=2.5,
        own_stream=False,
        draft_heads="auto",
        apology="hm",
    )
    cfg = engine_config(llm, "/cache")
    assert {f.name: getattr(cfg, f.name) for f in dataclasses.fields(llm)} == dataclasses.asdict(
        llm
    )
    assert cfg.models_cache == "/cache" and cfg.num_blocks == 0


def test_options_of_the_other_device_are_off_where_the_engine_runs():
    cpu = EngineConfig(
        cuda_graphs=True, own_stream=True, fused_kernels=True, torchscript=True
    ).on_device()
    assert (cpu.cuda_graphs, cpu.own_stream, cpu.fused_kernels, cpu.torchscript) == (
        False,
        False,
        False,
        True,
    )
    gpu = EngineConfig(device="cuda", cuda_graphs=True, torchscript=True).on_device()
    assert gpu.cuda_graphs and not gpu.torchscript


def test_the_start_up_line_says_whether_the_lm_head_was_quantized(caplog):
    """``llm.quant_head`` with INT4: a hidden width no group divides (96 here) keeps the head in
    the model's dtype, and the log line says so rather than that it was rounded."""
    import logging

    import torch

    from tests.engine.quantized import SMALL, TINY
    from voicert.engine.build import _quantize_weights
    from voicert.engine.models.llama import random_llama

    cfg = EngineConfig(device="cuda", int4=True, quant_head=True, rounding="nearest")
    for shape, said in ((SMALL, "the LM head's to nearest"), (TINY, "the LM head kept: no group")):
        model = random_llama(shape, torch.float32, "cpu")  # hidden widths 128 / 96
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="voicert.engine.build"):
            _quantize_weights(model, None, cfg)
        assert said in caplog.text
        assert isinstance(model.lm_head, torch.nn.Linear) == (shape is TINY)


def _quantize_small(cfg: EngineConfig, caplog, gguf=None) -> tuple[object, str]:
    """A random SMALL Llama (or ``gguf``'s: :func:`gguf_model`) quantized in place as ``cfg``
    says; the model and what was logged."""
    import logging

    import torch

    from tests.engine.quantized import SMALL
    from voicert.engine.build import _quantize_weights
    from voicert.engine.models.llama import random_llama

    model, model_dir = gguf() if gguf else (random_llama(SMALL, torch.float32, "cpu"), "")
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="voicert.engine.build"):
        _quantize_weights(model, None, cfg, model_dir)
    return model, caplog.text


@pytest.fixture
def hopper(monkeypatch):
    """torch reports a compute capability 9.0 GPU, so FP8 layers are built for it."""
    import torch

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda dev: (9, 0))


@pytest.mark.parametrize("setting", ["model", "int8"])
def test_int4_activations_int8_rounds_every_int4_layers_one_row_x(caplog, setting):
    """``llm.int4_activations: int8``: every INT4 Linear rounds a one-row bf16 step's x to int8
    by group (W4A8); the log line counts them. The default leaves x as it is."""
    from tests.engine.quantized import SMALL
    from voicert.engine.gpu.int4 import Int4Linear

    cfg = EngineConfig(device="cuda", int4=True, rounding="nearest", int4_activations=setting)
    model, said = _quantize_small(cfg, caplog)
    layers = [m for m in model.modules() if isinstance(m, Int4Linear)]
    assert len(layers) == 4 * SMALL.num_layers
    assert all(lin.a8 == (setting == "int8") for lin in layers)
    assert (f"{len(layers)} of them rounding a one-row x to int8 (W4A8)" in said) == (
        setting == "int8"
    )


@pytest.mark.parametrize("setting", ["fp8", "model"])
def test_fp8_activations_model_keeps_every_fp8_layers_x(hopper, caplog, setting):
    """``llm.fp8_activations: model``: no FP8 Linear rounds a step's rows to FP8 (W8A16); the
    log line counts them. The default (fp8) leaves them rounding."""
    from tests.engine.quantized import SMALL
    from voicert.engine.gpu.fp8 import Fp8Linear

    cfg = EngineConfig(device="cuda", fp8=True, rounding="nearest", fp8_activations=setting)
    model, said = _quantize_small(cfg, caplog)
    layers = [m for m in model.modules() if isinstance(m, Fp8Linear)]
    assert len(layers) == 4 * SMALL.num_layers
    assert all(lin.round_rows == (setting == "fp8") for lin in layers)
    assert (f"{len(layers)} FP8 keeping x in the model's dtype (W8A16)" in said) == (
        setting == "model"
    )


@pytest.fixture
def gguf_model(monkeypatch):
    """Makes a random SMALL Llama and a model directory whose GGUF file (the model's, v and
    down in Q6_K) the loader finds: () -> (model, directory)."""
    import torch

    from tests.engine.quantized import SMALL
    from tests.engine.test_gguf import _source
    from voicert.engine import loader
    from voicert.engine.gpu import gguf
    from voicert.engine.models.llama import random_llama

    def make():
        model = random_llama(SMALL, torch.float32, "cpu")
        src = _source(model, {"attn_v": "Q6_K", "ffn_down": "Q6_K"})
        monkeypatch.setattr(gguf, "GgufFile", lambda path: src)
        return model, "/models/x"

    monkeypatch.setattr(loader, "gguf_source", lambda d: gguf.Path(d) / "model.gguf")
    return make


def _layers(n_per_layer: int) -> int:
    from tests.engine.quantized import SMALL

    return n_per_layer * SMALL.num_layers


SPEC_WARNS = [  # (engine settings, what the speculation warning names, or None: no warning)
    ({"int4": True}, None),
    ({"int4": True, "int4_activations": "int8"}, f"{_layers(4)} INT4 layers (W4A8)"),
    ({"fp8": True}, f"{_layers(4)} FP8 layers (W8A8)"),
    ({"fp8": True, "fp8_activations": "model"}, None),
    ({"int4": True, "gguf": True}, f"{_layers(2)} FP8 layers (W8A8)"),  # its Q6_K layers
    (
        {"int4": True, "gguf": True, "int4_activations": "int8"},
        f"{_layers(2)} FP8 layers (W8A8) and {_layers(2)} INT4 layers (W4A8)",
    ),
]


@pytest.mark.parametrize(("settings", "named"), SPEC_WARNS)
def test_speculation_warns_where_a_steps_rows_change_how_x_is_rounded(
    hopper, gguf_model, caplog, settings, named
):
    """With speculation, the start-up log warns that replies are not token-identical to greedy
    where a quantized layer rounds x by how many rows share its step, and names the layers:
    FP8 rounding several rows on a GPU (also the FP8 layers of a GGUF model's ``llm.int4``) and
    W4A8 rounding one. Without speculation it says nothing of it."""
    settings = dict(settings)
    gguf = gguf_model if settings.pop("gguf", False) else None
    cfg = EngineConfig(**{"device": "cuda", "rounding": "nearest", **settings})
    for spec_tokens in (0, 2):
        _, said = _quantize_small(dataclasses.replace(cfg, spec_tokens=spec_tokens), caplog, gguf)
        warned = "not token-identical to greedy decoding" in said
        assert warned == (named is not None and spec_tokens > 0)
        assert not warned or f"{named} with speculation" in said


@pytest.mark.parametrize("capability", [(9, 0), (8, 0)])
def test_int4_on_a_gguf_model_serves_its_4_bit_layers_and_the_rest_fp8_where_it_runs(
    monkeypatch, gguf_model, caplog, capability
):
    """``llm.int4`` on a model converted from a GGUF file: its 4-bit layers hold the file's
    codes; a fused layer with a Q6_K part and the Q6_K layers go to FP8 where FP8 runs (compute
    capability 8.9+), else the part is rounded to INT4 within the imported layer and the Q6_K
    layers are rounded to INT4 in ``llm.int4_group``'s groups. The log line says which."""
    import torch

    from tests.engine.quantized import SMALL
    from voicert.engine.gpu.fp8 import Fp8Linear
    from voicert.engine.gpu.int4 import Int4Linear

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda dev: capability)
    cfg = EngineConfig(device="cuda", int4=True, rounding="nearest")
    model, said = _quantize_small(cfg, caplog, gguf_model)
    fp8 = capability >= (8, 9)
    layers = SMALL.num_layers
    for layer in model.layers:
        assert isinstance(layer.attn.o, Int4Linear) and layer.attn.o.group == 32
        assert isinstance(layer.mlp.gate_up, Int4Linear) and layer.mlp.gate_up.group == 32
        assert isinstance(layer.attn.qkv, Fp8Linear if fp8 else Int4Linear)
        assert isinstance(layer.mlp.down, Fp8Linear if fp8 else Int4Linear)
        if not fp8:  # the imported q/k/v in groups of 32; the Q6_K down in the config's
            assert (layer.attn.qkv.group, layer.mlp.down.group) == (32, 64)
    expected = (
        f"{2 * layers} hold model.gguf's own 4-bit codes (groups of 32); {2 * layers} the rest FP8"
        if fp8
        else f"{3 * layers} hold model.gguf's own 4-bit codes (groups of 32), {layers} of them "
        f"with a part rounded; {layers} INT4 (groups of 128)"
    )
    assert expected in said
