"""INT4 layer weights (group-wise scales and lows): the format, the layer's contract, GPTQ
onto its grid, what the engine does with it, and the quality on the embedded model's real
weights.

These run on the CPU, where :class:`Int4Linear` widens its weights before the matmul; the Triton
kernel that computes the same function on a GPU is checked in tests/engine/test_kernels.py."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tests.engine.quantized import SMALL, assert_greedy_is_the_dequantized_models
from voicert.engine.gpu.fp8 import gptq_round
from voicert.engine.gpu.int4 import (
    Int4Linear,
    grid,
    group_size,
    pack,
    quantize_int4,
    unpack,
)
from voicert.engine.models.layers import lm_head_out
from voicert.engine.models.llama import random_llama


def test_two_codes_of_a_group_share_a_byte_and_unpack_back():
    codes = torch.randint(0, 16, (5, 256), generator=torch.Generator().manual_seed(0))
    packed = pack(codes, 128)
    assert packed.dtype == torch.uint8 and packed.shape == (5, 128)
    assert (packed[:, 0] & 15).tolist() == codes[:, 0].tolist()  # column 0: the low nibble
    assert (packed[:, 0] >> 4).tolist() == codes[:, 64].tolist()  # its group's column 64
    assert (packed[:, 64] >> 4).tolist() == codes[:, 192].tolist()  # the second group's
    assert torch.equal(unpack(packed, 128), codes.to(torch.uint8))


def test_group_size_is_128_where_it_divides_else_64_else_none():
    assert [group_size(k) for k in (4096, 576, 1536, 96)] == [128, 64, 128, None]


def test_nearest_int4_spans_each_groups_own_range_within_half_a_step():
    g = torch.Generator().manual_seed(1)
    lin = torch.nn.Linear(256, 40, bias=True)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(40, 256, generator=g) * 0.05)
        lin.weight[3, :128] = 0.0  # a group of zeros: scale at its floor, zeros stay zeros
        lin.weight[4, 128:] = torch.rand(128, generator=g) + 1.0  # all in [1, 2]: so is its grid
    q = Int4Linear.from_linear(lin)
    assert q.weight.shape == (40, 128) and q.scale.shape == (40, 2) and q.group == 128
    assert q.scale.dtype == torch.float16 and q.low.dtype == torch.float16
    w = q.dequantized(torch.float32)
    step = q.scale.float().repeat_interleave(128, dim=1)
    fp16 = lin.weight.abs() * 2**-11  # the low's float16 rounding, at most
    assert ((w - lin.weight).abs() <= step / 2 + fp16 + 1e-7).all()  # nearest: half a step
    assert torch.equal(w[3, :128], torch.zeros(128))
    assert q.low[4, 1] >= 1.0 and (w[4, 128:] >= 1.0).all() and (w[4, 128:] <= 2.0).all()
    assert torch.equal(q.low[0], lin.weight[0].reshape(2, 128).amin(1).half())  # the group's min
    x = torch.randn(3, 256, generator=g)
    ref = lin(x).detach()
    assert ((q(x) - ref).norm() / ref.norm()).item() < 0.1  # 16 levels a group: ~5 % here


def test_the_integer_zero_grid_holds_zero_and_its_lows_are_whole_steps():
    """AWQ's grid (``integer_zero``): the range widened to hold 0, and low = -zero * scale for
    an integer zero, so the layer exports to AWQ. The low is that product in float16, so a zero
    weight comes back as 0 to within 2^-11 of the low."""
    g = torch.Generator().manual_seed(6)
    lin = torch.nn.Linear(128, 16, bias=False)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(16, 128, generator=g) * 0.05)
        lin.weight[5] = torch.rand(128, generator=g) + 0.5  # else positive: zero 0
        lin.weight[:, ::7] = 0.0
    q = Int4Linear.from_linear(lin, integer_zero=True)
    zero = -q.low.float() / q.scale.float()
    assert torch.allclose(zero, zero.round(), atol=0.01) and zero[5].item() == 0
    bound = q.low.float().abs().repeat_interleave(128, dim=1)[:, ::7] * 2**-11
    assert (q.dequantized(torch.float32)[:, ::7].abs() <= bound).all()
    own = Int4Linear.from_linear(lin)
    assert not torch.equal(own.low, q.low)  # the default grid is each group's own range


def test_the_layer_computes_with_its_dequantized_weights_and_keeps_the_inputs_dtype():
    g = torch.Generator().manual_seed(2)
    lin = torch.nn.Linear(192, 24, bias=True)
    q = Int4Linear.from_linear(lin)
    assert q.group == 64
    x = torch.randn(2, 3, 192, generator=g)
    want = torch.nn.functional.linear(x, q.dequantized(torch.float32), q.bias)
    assert torch.allclose(q(x), want, atol=1e-5, rtol=1e-5)
    assert q(x.bfloat16()).dtype == torch.bfloat16


def test_gptq_onto_the_int4_grid_lowers_the_output_error_on_its_inputs():
    """GPTQ chooses, within the same groups' scales and lows, the codes whose layer output on
    correlated inputs is closest to the original's: tr(E H E^T) below nearest rounding's."""
    g = torch.Generator().manual_seed(3)
    n, k, t = 48, 256, 2000
    mix = torch.randn(k, k, generator=g) / k**0.5
    x = torch.randn(t, k, generator=g) @ mix + 0.3 * torch.randn(t, k, generator=g)
    h = x.T @ x / t
    w = torch.randn(n, k, generator=g) * 0.05
    (q,), (scale,), (low,) = gptq_round([w], [h], grid(128))
    nearest = Int4Linear.from_linear(_linear(w)).dequantized(torch.float32)

    def err(v):
        e = v - w
        return (e @ h * e).sum().item()

    assert err(q) < 0.8 * err(nearest)
    layer = Int4Linear.from_linear(_linear(w), (q, scale, low))
    assert torch.allclose(layer.dequantized(torch.float32), q, atol=1e-6)  # codes hold q exactly
    assert torch.equal(layer.scale, Int4Linear.from_linear(_linear(w)).scale)  # static groups


def _linear(w: torch.Tensor) -> torch.nn.Linear:
    lin = torch.nn.Linear(w.shape[1], w.shape[0], bias=False)
    lin.weight.data.copy_(w)
    return lin


def test_only_the_layers_linears_turn_int4_and_their_bytes_fall_to_about_a_quarter():
    model = random_llama(SMALL, torch.bfloat16, "cpu")
    before = {n: p.nbytes for n, p in model.layers.named_parameters()}
    assert quantize_int4(model) == 4 * SMALL.num_layers  # qkv, o, gate_up, down
    for layer in model.layers:
        for mod in (layer.attn.qkv, layer.attn.o, layer.mlp.gate_up, layer.mlp.down):
            assert isinstance(mod, Int4Linear)
    assert isinstance(model.lm_head, torch.nn.Linear) and model.embed.weight.dtype == torch.bfloat16
    linear = sum(v for n, v in before.items() if "norm" not in n)
    after = sum(b.nbytes for n, b in model.layers.named_buffers() if "norm" not in n)
    assert linear / 4 < after < linear * 0.29  # codes, and a 2-byte scale + a 2-byte low a group


def test_gptq_over_layers_already_quantized_has_nothing_to_calibrate():
    """Layers that hold no nn.Linear any more (a GGUF model's, imported as the file holds them)
    are passed over: no calibration forward runs and nothing is replaced; a later layer that
    still has its Linears is rounded."""
    model = random_llama(SMALL, torch.float32, "cpu")
    quantize_int4(model)
    runs = []
    assert quantize_int4(model, lambda: runs.append(1)) == 0 and runs == []
    model.layers[1].mlp.down = _linear(model.layers[1].mlp.down.dequantized(torch.float32))
    with pytest.raises(RuntimeError, match="calibrated"):  # (GPTQ asks for its inputs)
        quantize_int4(model, lambda: (_ for _ in ()).throw(RuntimeError("calibrated")))


def test_a_layer_no_group_divides_keeps_its_weights():
    model = random_llama(dataclasses.replace(SMALL, intermediate_size=160), torch.float32, "cpu")
    assert quantize_int4(model) == 3 * SMALL.num_layers  # down (K = 160) stays
    assert isinstance(model.layers[0].mlp.down, torch.nn.Linear)


@pytest.mark.parametrize("group", [128, 32])
def test_int4_greedy_equals_the_dequantized_models_and_batched_and_cached_equal_one_at_a_time(
    group,
):
    """The INT4 model (groups of 128 or of ``llm.int4_group`` 32) is the model with its weights
    on the INT4 grid (tests/engine/quantized.py)."""
    assert_greedy_is_the_dequantized_models(SMALL, lambda m: quantize_int4(m, group=group))


def test_the_lm_head_too_computes_with_its_dequantized_weights_and_the_embedding_stays():
    """``llm.quant_head``: the head rounded to nearest on the same grid; a tied embedding keeps
    its weights; the head's output into a caller's buffer (guided decoding) is the same values."""
    model = random_llama(SMALL, torch.float32, "cpu")
    embed = model.embed.weight.detach().clone()
    assert quantize_int4(model, head=True) == 4 * SMALL.num_layers + 1
    assert isinstance(model.lm_head, Int4Linear) and torch.equal(model.embed.weight, embed)
    h = torch.randn(3, SMALL.hidden_size, generator=torch.Generator().manual_seed(5))
    want = torch.nn.functional.linear(h, model.lm_head.dequantized(torch.float32))
    out = torch.empty(3, SMALL.vocab_size)
    assert torch.equal(lm_head_out(model.lm_head, h, out), out)
    assert torch.allclose(out, want, atol=1e-5) and torch.equal(model.greedy(h), want.argmax(-1))
    assert_greedy_is_the_dequantized_models(SMALL, lambda m: quantize_int4(m, head=True))


@pytest.fixture(scope="module")
def embedded():
    from transformers import AutoTokenizer

    from voicert.config import cache_dir, load_config
    from voicert.engine.loader import resolve_llm
    from voicert.engine.models.registry import load_model

    model_dir = resolve_llm("embedded", cache_dir(load_config(environ={}).models))
    return load_model(model_dir, torch.float32, "cpu"), AutoTokenizer.from_pretrained(model_dir)


def test_gptq_int4_keeps_most_of_the_real_embedded_models_next_tokens(embedded, monkeypatch):
    """Top-1 agreement with the unquantized model, teacher-forced over the bench's text set, of
    the embedded SmolLM2-135M with GPTQ INT4 weights over part of the calibration set (the first
    24 rows, to keep the test short), against nearest rounding's. Measured (``python -m
    voicert.bench.fp8 --quantize int4``, docs/benchmarks.md section 46): see the bars below;
    a broken scale, low or nibble order falls far below them."""
    from voicert.bench.fp8 import TEXTS, quantized_copy, top1_agreement
    from voicert.engine.core import calibration

    ref, tok = embedded
    rows = calibration.calibration_rows(tok)
    monkeypatch.setattr(calibration, "calibration_rows", lambda _tok: rows[:24])
    texts = [tok(t)["input_ids"] for t in TEXTS]
    near, total = top1_agreement(ref, quantized_copy(ref, quant="int4"), texts)
    gptq, _ = top1_agreement(ref, quantized_copy(ref, tok, quant="int4"), texts)
    print(f"INT4 top-1: nearest {near}/{total}, GPTQ (24 rows) {gptq}/{total}")
    assert near / total >= 0.66 and gptq / total >= 0.75 and gptq > near
