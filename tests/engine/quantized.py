"""Shared by the tests of quantized layer weights (test_fp8.py, test_int4.py): the small Llama
shapes they quantize, and the check that a quantized model computes exactly with its
dequantized weights."""

from __future__ import annotations

import copy
import dataclasses
import random
from collections.abc import Callable

import torch

from tests.engine.test_architectures import decode, fresh
from voicert.engine.models.llama import LlamaConfig, random_llama

TINY = LlamaConfig(  # widths of 96 and 160: FP8's per-channel scales need no group
    vocab_size=300,
    hidden_size=96,
    intermediate_size=160,
    num_layers=2,
    num_heads=6,
    num_kv_heads=2,
    head_dim=16,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    max_position=4096,
    tie_word_embeddings=True,
)

SMALL = dataclasses.replace(  # every width a multiple of 64 (a group) but the MLP's 192 (64 only)
    TINY, hidden_size=128, intermediate_size=192, num_heads=8
)

LINEARS = ("attn.qkv", "attn.o", "mlp.gate_up", "mlp.down")


def assert_greedy_is_the_dequantized_models(
    config: LlamaConfig, quantize: Callable[[torch.nn.Module], object]
) -> None:
    """A random model of ``config`` quantized in place by ``quantize`` is the model with its
    weights (its LM head's too, if quantized) on the grid: its greedy tokens equal those of a
    plain model holding the dequantized weights, decoded together or one at a time, with a
    prefix from the cache or without."""
    model = random_llama(config, torch.float32, "cpu")
    with torch.no_grad():
        model.lm_head.weight.mul_(30)  # wide logit margins (the head is tied: embeddings too)
    quant = copy.deepcopy(model)
    quantize(quant)
    plain = copy.deepcopy(model)
    with torch.no_grad():
        for lp, lq in zip(plain.layers, quant.layers):
            for name in LINEARS:
                lin, q = lp.get_submodule(name), lq.get_submodule(name)
                lin.weight.copy_(q.dequantized(torch.float32))
        if not isinstance(quant.lm_head, torch.nn.Linear):  # llm.quant_head: a head of its own
            plain.lm_head = torch.nn.Linear(config.hidden_size, config.vocab_size, bias=False)
            plain.lm_head.weight.copy_(quant.lm_head.dequantized(torch.float32))
    rng = random.Random(4)
    prompts = [[rng.randrange(1, config.vocab_size) for _ in range(n)] for n in (5, 19, 40)]
    together = decode(quant, prompts)
    assert together == decode(plain, prompts)
    assert together == [decode(quant, [p])[0] for p in prompts]
    engine = fresh(quant)
    decode(quant, [prompts[2]], engine=engine)
    longer = prompts[2] + prompts[1]
    assert decode(quant, [longer], engine=engine) == decode(quant, [longer])
