"""AWQ checkpoints (engine/gpu/awq.py): the published nibble order and formula, a checkpoint
loading as INT4 layers that decode as the model it was written from, and clear errors for
quantized checkpoints of another kind."""

from __future__ import annotations

import json

import pytest
import torch

from tests.engine.test_architectures import decode
from voicert.engine.gpu.awq import awq_group, from_awq, save_llama_awq, to_awq
from voicert.engine.gpu.int4 import Int4Linear, quantize_int4
from voicert.engine.models.registry import load_model


def test_eight_columns_pack_into_one_int32_in_awqs_order():
    """AutoAWQ's order: nibble i (bits 4i) of an int32 holds column (0, 2, 4, 6, 1, 3, 5, 7)[i]."""
    codes = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8]], dtype=torch.uint8)  # row n: n + 1
    lin = Int4Linear(
        torch.zeros(8, 16, dtype=torch.uint8),
        torch.ones(8, 1).half(),
        torch.zeros(8, 1).byte(),
        None,
    )  # N = 8 rows, K = 32 in one group of 32
    lin.weight[:, 0] = codes[0]  # column 0 of each row n holds n + 1 (its low nibble)
    qweight = to_awq(lin)["qweight"]  # [K, N / 8]
    want = 1 | 3 << 4 | 5 << 8 | 7 << 12 | 2 << 16 | 4 << 20 | 6 << 24 | 8 << 28
    assert qweight.dtype == torch.int32 and qweight.shape == (32, 1)
    assert qweight[0, 0].item() == want - (1 << 32)  # (the top nibble 8 makes it negative)


def test_an_awq_layer_computes_the_published_formula():
    """w[n, k] = (code[k, n] - zero[g, n]) * scale[g, n], codes and zeros unpacked in AWQ's
    order (to within the float16 of the low, -zero * scale), and back again to the same
    tensors."""
    g = torch.Generator().manual_seed(1)
    k, n, group = 64, 16, 32
    qweight = torch.randint(-(2**31), 2**31 - 1, (k, n // 8), generator=g, dtype=torch.int32)
    qzeros = torch.randint(
        -(2**31), 2**31 - 1, (k // group, n // 8), generator=g, dtype=torch.int32
    )
    scales = (torch.rand(k // group, n, generator=g) + 0.1).half()
    lin = Int4Linear(*from_awq(qweight, qzeros, scales), None)

    def unpacked(t):  # [R, C / 8] -> [R, C]: column 8c + j sits at nibble i where ORDER[i] = j
        order = [0, 4, 1, 5, 2, 6, 3, 7]  # the inverse permutation, as AutoAWQ writes it
        nib = [(t >> (4 * i)) & 15 for i in range(8)]
        return torch.stack([nib[order[j]] for j in range(8)], dim=2).reshape(t.shape[0], -1)

    code, zero = unpacked(qweight).float(), unpacked(qzeros).float()
    offset = zero.repeat_interleave(group, 0) * scales.float().repeat_interleave(group, 0)
    want = code * scales.float().repeat_interleave(group, 0) - offset
    err = (lin.dequantized(torch.float32) - want.t()).abs()
    assert (err <= offset.t() * 2**-11).all() and err.max() > 0  # (the low is rounded)
    back = to_awq(lin)
    assert torch.equal(back["qweight"], qweight) and torch.equal(back["qzeros"], qzeros)
    assert torch.equal(back["scales"], scales)


def _hf_checkpoint(kind: str, out):
    import transformers as t

    common = dict(
        vocab_size=512,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=False,
    )
    cfg, cls = (
        (t.Qwen2Config(**common), t.Qwen2ForCausalLM)  # q/k/v biases
        if kind == "qwen2"
        else (t.LlamaConfig(**common), t.LlamaForCausalLM)
    )
    torch.manual_seed(0)
    model = cls(cfg).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(30)  # wide logit margins
    model.save_pretrained(out)
    return out


@pytest.mark.parametrize("kind, group", [("llama", 128), ("qwen2", 32)])
def test_an_awq_checkpoint_loads_as_int4_layers_that_decode_as_the_model_it_was_written_from(
    tmp_path, kind, group
):
    src = _hf_checkpoint(kind, tmp_path / "hf")
    model = load_model(src, torch.float32, "cpu")
    quantize_int4(model, group=group, integer_zero=True)
    out = save_llama_awq(model, src, tmp_path / "awq")
    assert json.loads((out / "config.json").read_text())["quantization_config"]["group_size"] == (
        group
    )
    loaded = load_model(out, torch.float32, "cpu")
    for ours, theirs in zip(model.layers, loaded.layers):
        for name in ("attn.qkv", "attn.o", "mlp.gate_up", "mlp.down"):
            a, b = ours.get_submodule(name), theirs.get_submodule(name)
            assert isinstance(b, Int4Linear) and b.scale.dtype == torch.float16
            for buf in ("weight", "scale", "low", "bias"):
                x, y = getattr(a, buf), getattr(b, buf)
                assert (x is None and y is None) or torch.equal(x, y), (name, buf)
    prompts = [[3, 14, 15, 92, 65], [35, 89, 79, 32, 38, 46, 26, 43, 38, 32, 79, 50]]
    assert decode(loaded, prompts) == decode(model, prompts)


def test_a_model_moved_to_another_dtype_keeps_its_int4_scales_in_float16(tmp_path):
    model = load_model(_hf_checkpoint("llama", tmp_path / "hf"), torch.float32, "cpu")
    quantize_int4(model)
    model = model.to(torch.bfloat16)
    lin = model.layers[0].attn.qkv
    assert lin.scale.dtype == torch.float16 and lin.low.dtype == torch.float16


def test_a_layer_on_its_own_groups_ranges_is_refused_for_awq_saying_how_far_off_it_is():
    """int4.py's default grid has float lows, which AWQ's integer zeros cannot hold: the export
    says so rather than move the weights."""
    lin = torch.nn.Linear(64, 16, bias=False)
    with pytest.raises(ValueError, match="not integer zeros .off by up to 0.[0-9]+ of a step"):
        to_awq(Int4Linear.from_linear(lin, None, 32))
    to_awq(Int4Linear.from_linear(lin, None, 32, integer_zero=True))


@pytest.mark.parametrize(
    "quant, message",
    [
        ({"quant_method": "gptq", "bits": 4}, "quant_method 'gptq': only AWQ"),
        ({"quant_method": "awq", "bits": 8}, "bits 4 and zero_point"),
        ({"quant_method": "awq", "bits": 4, "version": "gemv"}, "version 'gemv'"),
        ({"quant_method": "awq", "bits": 4, "group_size": 256}, "group_size 256"),
    ],
)
def test_a_quantized_checkpoint_of_another_kind_is_refused_naming_the_field(quant, message):
    with pytest.raises(ValueError, match=message):
        awq_group({"quantization_config": quant})
    assert awq_group({}) is None


def test_the_command_writes_a_checkpoint_that_loads_as_int4(tmp_path, capsys):
    from voicert.engine.export_awq import main

    src = _hf_checkpoint("llama", tmp_path / "hf")
    assert main([str(src), str(tmp_path / "awq"), "--rounding", "nearest", "--group", "64"]) == 0
    assert "8 INT4 layers (groups of 64, nearest)" in capsys.readouterr().out
    loaded = load_model(tmp_path / "awq", torch.float32, "cpu")
    assert (
        isinstance(loaded.layers[1].mlp.down, Int4Linear) and loaded.layers[1].mlp.down.group == 64
    )
