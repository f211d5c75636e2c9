"""A KV cache in one byte a value (llm.kv_cache: int8 | fp8): what the pool holds, what the
engine does with it, and its quality on the embedded model's real weights. On the CPU the torch
layers round k and v into the pool and widen them as they read; tests/engine/test_gpu.py checks
the Triton kernels against that."""

from __future__ import annotations

import random

import pytest
import torch

from tests.engine.quantized import TINY
from tests.engine.test_architectures import decode
from tests.engine.test_fp8 import embedded  # noqa: F401  (the fixture, shared)
from voicert.engine.core.kv_cache import BlockManager
from voicert.engine.core.runner import ModelRunner
from voicert.engine.core.scheduler import Scheduler, SchedulerConfig
from voicert.engine.models.layers import FP8_KV, INT8_KV, read_blocks, write_kv
from voicert.engine.models.llama import random_llama

X = torch.tensor([[[1.0, 600.0, -1000.0], [0.1, 0.0123, 3.3]]] * 2)  # [T, KVH, D]


def stored(dtype: torch.dtype, d: int = 3) -> torch.Tensor:
    """X written at slots 1 and 6 of a pool [NB=4, BS=2, KVH=2, row], read back as blocks 0, 3."""
    pool = torch.zeros(4, 2, 2, d + (4 if dtype == INT8_KV else 0), dtype=dtype)
    write_kv(pool, torch.tensor([1, 6]), X)
    blocks = read_blocks(pool, torch.tensor([0, 3]), torch.float32)  # [2, BS, KVH, D]
    assert not blocks[0, 0].any() and not blocks[1, 1].any()  # other slots untouched
    assert torch.equal(blocks[0, 1], blocks[1, 0])
    return blocks[0, 1]


def test_an_fp8_pool_holds_each_value_rounded_to_e4m3_and_clamped_to_its_range():
    got = stored(FP8_KV)
    assert torch.equal(got, X[0].clamp(-448, 448).to(FP8_KV).float())
    assert got[0].tolist() == [1.0, 448.0, -448.0] and got[1, 2].item() == 3.25


def test_an_int8_pool_holds_each_row_within_half_a_step_of_its_own_scale():
    got = stored(INT8_KV)
    step = X[0].abs().amax(-1, keepdim=True) / 127  # [KVH, 1]: each head row's own scale
    assert (got - X[0]).abs().le(step / 2 + 1e-6).all()
    assert got[0, 2].item() == pytest.approx(-1000.0) and got[0, 1].item() == pytest.approx(
        600.0, abs=1000 / 254
    )  # the row's largest value is exact, the rest within half a step


def fresh_quantized(model, dtype):
    return (
        Scheduler(BlockManager(128, 16), SchedulerConfig(), stop_ids=set()),
        ModelRunner(model, 128, 16, kv_dtype=dtype),
    )


@pytest.mark.parametrize("dtype", [FP8_KV, INT8_KV])
def test_batched_equals_one_at_a_time_and_cached_equals_uncached_over_a_one_byte_cache(dtype):
    model = random_llama(TINY, torch.float32, "cpu")
    with torch.no_grad():
        model.lm_head.weight.mul_(30)  # wide logit margins
    rng = random.Random(7)
    prompts = [[rng.randrange(1, 300) for _ in range(n)] for n in (6, 23, 41)]
    together = decode(model, prompts, engine=fresh_quantized(model, dtype))
    assert together == [
        decode(model, [p], engine=fresh_quantized(model, dtype))[0] for p in prompts
    ]
    engine = fresh_quantized(model, dtype)
    assert engine[1].k_pool.dtype == dtype and engine[1].k_pool.element_size() == 1
    decode(model, [prompts[2]], engine=engine)  # its blocks stay in the prefix cache
    longer = prompts[2] + prompts[0]
    assert decode(model, [longer], engine=engine) == decode(
        model, [longer], engine=fresh_quantized(model, dtype)
    )


def test_a_one_byte_cache_holds_about_twice_the_blocks_of_bf16_in_the_same_memory():
    model = random_llama(TINY, torch.float32, "cpu")  # head_dim 16: int8's scale is 4 bytes of 20
    bf16 = ModelRunner.kv_bytes_per_block(model, 16, torch.bfloat16)
    assert ModelRunner.kv_bytes_per_block(model, 16, FP8_KV) * 2 == bf16
    assert ModelRunner.kv_bytes_per_block(model, 16, INT8_KV) * 32 == bf16 * 20


def test_a_one_byte_cache_keeps_the_real_embedded_models_next_tokens(embedded):
    """Top-1 agreement with the model over its own-dtype cache, teacher-forced over the bench's
    fixed text set (``python -m voicert.bench.fp8 --quantize kv-int8,kv-fp8``; fp32 here, where
    the CPU is fastest). The issue's bar is 97 %. Measured: int8 with a scale per token and head,
    99.1 % (fp32) and 96.7 % (bf16); fp8 with one scale of 1, 94.8 % both (e4m3's three mantissa
    bits; docs/benchmarks.md 27). The floors guard those levels: a broken scale or rounding falls
    far below them."""
    from voicert.bench.fp8 import TEXTS, next_tokens

    load, tok = embedded
    model = load(torch.float32)
    texts = [tok(t)["input_ids"] for t in TEXTS]
    ref = next_tokens(model, texts)
    total = sum(len(r) for r in ref)
    assert total > 200
    for kind, floor in (("int8", 0.98), ("fp8", 0.93)):
        got = next_tokens(model, texts, kv_cache=kind)
        same = sum(a == b for r, g in zip(ref, got) for a, b in zip(r, g))
        assert same / total >= floor, f"{kind}: {same}/{total}"
