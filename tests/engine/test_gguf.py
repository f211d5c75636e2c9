"""GGUF's 4-bit tensors served as INT4 layers with no rounding of our own (engine/gpu/gguf.py):
the decoding against gguf-py's own dequantization, the import into a model's fused layers, the
layers it leaves, and the embedded model's real Q4_1 file."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, quants

from tests.engine.quantized import SMALL
from voicert.engine.gpu import gguf
from voicert.engine.gpu.gguf import GgufFile, Tensor, decode, import_int4
from voicert.engine.gpu.int4 import Int4Linear
from voicert.engine.models.llama import random_llama

SIZES = {"Q4_0": (32, 18), "Q4_1": (32, 20), "Q4_K": (256, 144)}  # columns, bytes a block


def _blocks(kind: str, rows: int, cols: int, seed: int) -> np.ndarray:
    """Random raw rows uint8 [rows, bytes] of ``kind`` with finite float16 d (and m / dmin)."""
    rng = np.random.default_rng(seed)
    per, size = SIZES[kind]
    b = rng.integers(0, 256, (rows, cols // per, size), dtype=np.uint8)
    halves = 4 if kind != "Q4_0" else 2
    f16 = (rng.standard_normal((rows, cols // per, halves // 2)) * 0.01).astype(np.float16)
    b[..., :halves] = f16.view(np.uint8).reshape(rows, cols // per, halves)
    return b.reshape(rows, -1)


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1", "Q4_K"])
def test_decoded_codes_scales_and_lows_are_gguf_pys_dequantized_values_exactly(kind):
    blocks = _blocks(kind, 6, 512, seed=len(kind))
    codes, scale, low = decode(kind, blocks)
    assert codes.shape == (6, 512) and scale.shape == low.shape == (6, 16)
    assert codes.max() <= 15
    ours = codes.astype(np.float32) * np.repeat(scale, 32, 1) + np.repeat(low, 32, 1)
    want = quants.dequantize(blocks, GGMLQuantizationType[kind])
    assert np.array_equal(ours, want)


def test_a_type_of_more_bits_is_not_decoded():
    with pytest.raises(ValueError, match="Q6_K is not a 4-bit type"):
        decode("Q6_K", np.zeros((1, 210), dtype=np.uint8))


def _source(model: torch.nn.Module, kinds: dict[str, str], arch: str = "qwen2") -> GgufFile:
    """A GGUF file's tensors for ``model`` (``kinds``: a part's type, Q4_1 where not named), its
    layers' weights set to the file's values (as transformers' conversion would hold them). A
    part of another type keeps the model's weights."""
    src = GgufFile.__new__(GgufFile)
    src.path, src.arch, src.tensors = gguf.Path("model.gguf"), arch, {}
    src.heads, src.kv_heads = SMALL.num_heads, SMALL.num_kv_heads
    for i, layer in enumerate(model.layers):
        for path, parts in gguf.PARTS.items():
            lin = layer.get_submodule(path)
            first = 0
            for j, part in enumerate(parts):
                rows = lin.out_features // len(parts) if len(parts) == 2 else None
                if path == "attn.qkv":
                    q, kv = SMALL.num_heads * SMALL.head_dim, SMALL.num_kv_heads * SMALL.head_dim
                    rows = (q, kv, kv)[j]
                rows = rows or lin.out_features
                kind = kinds.get(part, "Q4_1")
                name = f"blk.{i}.{part}.weight"
                if kind in gguf.FOUR_BIT:
                    data = _blocks(kind, rows, lin.in_features, seed=1000 * i + 10 * j)
                    src.tensors[name] = Tensor(kind, data)
                    values = torch.from_numpy(
                        quants.dequantize(data, GGMLQuantizationType[kind]).copy()
                    )
                    with torch.no_grad():
                        lin.weight[first : first + rows] = values
                else:
                    src.tensors[name] = Tensor(kind, np.zeros((rows, 1), dtype=np.uint8))
                first += rows
    return src


@pytest.mark.parametrize("round_parts", [True, False])
def test_the_4_bit_parts_hold_the_files_codes_and_a_fused_layers_other_part_is_rounded(
    round_parts,
):
    """q/k/v with a Q6_K v: its q and k rows hold the file's values exactly (Q4_1's d and m are
    float16 already) and its v rows are rounded to nearest INT4 in groups of 32; without
    ``round_parts`` the layer is left whole. The other layers import with their bias."""
    model = random_llama(SMALL, torch.float32, "cpu")
    src = _source(model, {"attn_v": "Q6_K"})
    want = {n: p.detach().clone() for n, p in model.layers.named_parameters()}
    done = import_int4(model, src, round_parts)
    mixed = [f"layers.{i}.attn.qkv (Q4_1/Q4_1/Q6_K)" for i in range(SMALL.num_layers)]
    assert done.count == (4 if round_parts else 3) * SMALL.num_layers
    assert (done.rounded, done.left) == ((mixed, []) if round_parts else ([], mixed))
    q, kv = SMALL.num_heads * SMALL.head_dim, SMALL.num_kv_heads * SMALL.head_dim
    for i, layer in enumerate(model.layers):
        for path in ("attn.o", "mlp.gate_up", "mlp.down"):
            lin = layer.get_submodule(path)
            assert isinstance(lin, Int4Linear) and lin.group == 32
            assert torch.equal(lin.dequantized(torch.float32), want[f"{i}.{path}.weight"])
        qkv, held = layer.attn.qkv, want[f"{i}.attn.qkv.weight"]
        if not round_parts:
            assert isinstance(qkv, torch.nn.Linear)
            continue
        w = qkv.dequantized(torch.float32)
        assert torch.equal(w[: q + kv], held[: q + kv])
        v = Int4Linear.from_linear(_linear(held[q + kv :]), None, 32).dequantized(torch.float32)
        assert torch.equal(w[q + kv :], v) and not torch.equal(v, held[q + kv :])


def _linear(w: torch.Tensor) -> torch.nn.Linear:
    lin = torch.nn.Linear(w.shape[1], w.shape[0], bias=False)
    lin.weight.data.copy_(w)
    return lin


def test_llama_files_q_and_k_rows_are_put_back_in_the_checkpoints_order():
    """llama.cpp's converter interleaves each head's q / k rows for its RoPE; transformers'
    GGUF loader undoes that, and so must the import, or its check refuses the layer."""
    model = random_llama(SMALL, torch.float32, "cpu")
    src = _source(model, {}, arch="llama")  # the model holds the rows in the file's order
    with pytest.raises(ValueError, match="layers.0.attn.qkv are not the weights the model holds"):
        import_int4(model, src)
    for lin in (model.layers[0].attn.qkv, model.layers[1].attn.qkv):
        q, kv = SMALL.num_heads * SMALL.head_dim, SMALL.num_kv_heads * SMALL.head_dim
        with torch.no_grad():  # now as transformers would hold them
            for rows, heads in ((slice(0, q), SMALL.num_heads), (slice(q, q + kv), 2)):
                w = lin.weight[rows].numpy()
                lin.weight[rows] = torch.from_numpy(gguf._unpermute(w, heads).copy())
    done = import_int4(model, src)
    assert done.count == 4 * SMALL.num_layers and done.left == done.rounded == []


def test_a_file_of_other_shapes_is_refused_naming_the_layer():
    model = random_llama(SMALL, torch.float32, "cpu")
    src = _source(model, {})
    src.tensors["blk.1.ffn_down.weight"] = Tensor("Q4_1", _blocks("Q4_1", 64, 192, seed=3))
    with pytest.raises(ValueError, match=r"ffn_down.weight have \[64\] rows .*, layers.1.mlp.down"):
        import_int4(model, src)


def test_the_embedded_models_q4_1_layers_import_to_exactly_the_weights_it_serves():
    """The embedded SmolLM2-135M ships as Q4_1 (a llama file): every layer imports, its
    weights are the dequantized checkpoint's bit for bit, and so are its next tokens."""
    from voicert.bench.fp8 import next_tokens
    from voicert.config import cache_dir, load_config
    from voicert.engine.loader import embedded_gguf, gguf_source, resolve_llm
    from voicert.engine.models.registry import load_model

    model_dir = resolve_llm("embedded", cache_dir(load_config(environ={}).models))
    assert gguf_source(model_dir) == embedded_gguf().resolve()
    model = load_model(model_dir, torch.float32, "cpu")
    held = {n: p.detach().clone() for n, p in model.layers.named_parameters()}
    texts = [[1, 504, 3458, 314, 260, 1645, 30, 2330, 288, 260]]
    want = next_tokens(model, texts)
    done = import_int4(model, GgufFile(embedded_gguf()))
    assert done.count == 4 * len(model.layers) and done.left == done.rounded == []
    for i, layer in enumerate(model.layers):
        for path in gguf.PARTS:
            q = layer.get_submodule(path)
            assert torch.equal(q.dequantized(torch.float32), held[f"{i}.{path}.weight"])
    assert next_tokens(model, texts) == want
