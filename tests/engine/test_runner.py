"""The model runner's CPU TorchScript forward against the eager forward: the same ops, so the same
bits, over the shapes the engine runs (batch sizes, query widths, context lengths)."""

import dataclasses
import random

import pytest
import torch

from voicert.engine.core.runner import ModelRunner, Row, TracedForward
from voicert.engine.models.layers import (
    GROUP_COST_BLOCKS,
    NarrowLinear,
    narrow_linears,
    plan_groups,
)
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


def spans_of(spans, width, bs, rng):
    """Rows of ``width`` new tokens after ``spans[i]`` cached ones, each its own blocks."""
    rows, nxt = [], 1
    for start in spans:
        need = -(-(start + width) // bs)
        rows.append(
            Row([rng.randrange(500) for _ in range(width)], start, list(range(nxt, nxt + need)), 0)
        )
        nxt += need
    return rows


@pytest.fixture
def one_thread():
    """On more than one thread, CPU SDPA splits its work by the batch's shape, so any other
    batch (not only key groups) sums in another order; on one, the sums are the same."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.mark.parametrize("torchscript", [False, True], ids=["eager", "traced"])
def test_rows_attending_in_key_groups_match_rows_padded_to_the_longest(torchscript, one_thread):
    model = random_llama(TINY, torch.float32, "cpu")
    padded, grouped = (ModelRunner(model, 400, 16, torchscript=torchscript) for _ in range(2))
    padded.key_groups = False
    rng = random.Random(3)
    for spans, width in [
        ([2000, 40, 60, 30], 1),  # a long history beside short replies' decode steps
        ([30, 1700, 50, 1200, 20, 900], 3),  # verify steps, three spans
        ([700, 10, 25], 24),  # prefill chunks
    ]:
        rows = spans_of(spans, width, 16, rng)
        for runner in (padded, grouped):
            runner.k_pool.normal_(generator=torch.Generator().manual_seed(1))
            runner.v_pool.normal_(generator=torch.Generator().manual_seed(2))
        outs = []
        for runner in (padded, grouped):
            ids, inp = runner.prepare(rows)
            assert (inp.groups is None) == (runner is padded)
            with torch.inference_mode():
                outs.append(runner.forward(ids, inp, runner.k_pool, runner.v_pool))
        assert torch.equal(outs[0], outs[1]), spans
        assert torch.equal(padded.k_pool, grouped.k_pool)
        assert padded.forward_rows(rows).tokens == grouped.forward_rows(rows).tokens


def test_a_long_row_attends_alone_and_like_rows_share_a_group():
    assert plan_groups([125, 3, 4, 2]) == [([0], 125), ([2, 1, 3], 4)]
    assert plan_groups([20, 21, 19, 22]) == [([3, 1, 0, 2], 22)]  # padding costs less than a group
    assert plan_groups([7]) == [([0], 7)]


def partitions(items):
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for part in partitions(rest):
        yield [[first], *part]
        for i in range(len(part)):
            yield [*part[:i], [first, *part[i]], *part[i + 1 :]]


@pytest.mark.parametrize("seed", range(40))
def test_key_groups_cost_the_least_of_every_way_to_split_the_rows(seed):
    rng = random.Random(seed)
    blocks = [rng.choice([1, 2, 3, 8, 9, 30, 120]) for _ in range(rng.randrange(1, 7))]

    def cost(groups):
        return sum(len(g) * max(blocks[i] for i in g) + GROUP_COST_BLOCKS for g in groups)

    plan = plan_groups(blocks)
    assert sorted(i for rows, _ in plan for i in rows) == list(range(len(blocks)))
    assert all(span == max(blocks[i] for i in rows) for rows, span in plan)
    assert cost([rows for rows, _ in plan]) == min(
        cost(p) for p in partitions(list(range(len(blocks))))
    )


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 64])
@pytest.mark.parametrize("bias", [False, True])
def test_few_rows_through_the_narrow_side_of_the_product_equal_the_linear(rows, bias):
    gen = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 1, 96, generator=gen)  # [B, Q, K]
    lin = torch.nn.Linear(96, 200, bias=bias)
    want = lin(x)
    assert narrow_linears(lin) == 1 and isinstance(lin, NarrowLinear)
    got = lin(x)
    assert got.shape == (rows, 1, 200) and got.is_contiguous()
    torch.testing.assert_close(got, want)


def test_the_cpu_runner_narrows_plain_linears_and_leaves_int8_ones():
    model = random_llama(TINY, torch.float32, "cpu")
    ModelRunner(model, 20, 16)
    assert type(model.layers[0].attn.qkv) is NarrowLinear and type(model.lm_head) is NarrowLinear
    int8 = torch.ao.quantization.quantize_dynamic(
        random_llama(TINY, torch.float32, "cpu"), {torch.nn.Linear}, dtype=torch.qint8
    )
    before = type(int8.layers[0].mlp.down)
    ModelRunner(int8, 20, 16)
    assert type(int8.layers[0].mlp.down) is before is not NarrowLinear
