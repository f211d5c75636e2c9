"""Building an engine from the config tree: one set of defaults (the ``llm`` section's), every
key carried, the other device's options off."""

import dataclasses

from voicert.config import LlmConfig
from voicert.engine.build import EngineConfig, engine_config


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
