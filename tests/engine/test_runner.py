"""The model runner's CPU TorchScript forward against the eager forward: the same ops, so the same
bits, over the shapes the engine runs (batch sizes, query widths, context lengths)."""

import dataclasses
import random

import pytest
import torch

from voicert.engine.core.runner import ModelRunner, Row, TracedForward
from voicert.engine.models.llama import LlamaConfig, random_llama

TINY = LlamaConfig(
    vocab_size=500,
    hidden_size=64,
    intermediate_size=128,
    num_layers=3,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    max_position=4096,
    tie_word_embeddings=True,
)
# Qwen2's q/k/v biases and Llama 3's RoPE scaling, untied head
QWEN_LLAMA3 = dataclasses.replace(
    TINY,
    attention_bias=True,
    tie_word_embeddings=False,
    rope_scaling={
        "rope_type": "llama3",
        "factor": 32.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    },
)


def rows_of(shape, bs, rng):
    """``shape`` = (batch, width, context): rows with ragged contexts, each its own blocks."""
    b, q, c = shape
    rows, nxt = [], 1
    for i in range(b):
        start = c + 7 * i
        need = -(-(start + q) // bs)
        rows.append(
            Row(
                [rng.randrange(500) for _ in range(q - (i % 2 if q > 1 else 0))],
                start,
                list(range(nxt, nxt + need)),
                0,
            )
        )
        nxt += need
    return rows


@pytest.mark.parametrize(
    "cfg,int8",
    [(TINY, False), (TINY, True), (QWEN_LLAMA3, False)],
    ids=["fp32", "int8", "bias-llama3-rope"],
)
def test_torchscript_forward_is_bit_identical_to_eager(cfg, int8):
    model = random_llama(cfg, torch.float32, "cpu")
    if int8:
        model = torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)
    eager, traced = ModelRunner(model, 120, 16), ModelRunner(model, 120, 16, torchscript=True)
    assert isinstance(traced.forward, TracedForward) and eager.forward is model
    rng = random.Random(0)
    for shape in [(1, 1, 0), (1, 1, 300), (3, 1, 45), (2, 3, 120), (1, 40, 17), (4, 1, 200)]:
        rows = rows_of(shape, 16, rng)
        for runner in (eager, traced):  # the same cached prefix in both pools
            runner.k_pool.normal_(generator=torch.Generator().manual_seed(1))
            runner.v_pool.normal_(generator=torch.Generator().manual_seed(2))
        outs = []
        for runner in (eager, traced):
            ids, inp = runner.prepare(rows)
            with torch.inference_mode():
                outs.append(runner.forward(ids, inp, runner.k_pool, runner.v_pool))
        assert torch.equal(outs[0], outs[1]), shape
        assert torch.equal(eager.k_pool, traced.k_pool) and torch.equal(eager.v_pool, traced.v_pool)
        assert eager.forward_rows(rows).tokens == traced.forward_rows(rows).tokens
