"""The weight-quality bench's text sets and its table (its figures are measured, not asserted)."""

import pytest

from voicert.bench.fp8 import main, render_quality, turn_texts
from voicert.bench.turn_set import ITEMS


def test_the_turn_set_texts_hold_every_items_words_eight_to_a_text_without_pause_marks():
    texts = turn_texts()
    assert len(texts) == -(-len(ITEMS) // 8)
    assert all("|" not in t and "  " not in t for t in texts)
    assert " ".join(texts).split() == [
        w for item in ITEMS for w in item.text.replace("|", " ").split()
    ]


def test_the_quality_table_names_int4s_group_and_both_text_sets():
    q = {
        "model": "m",
        "variant": "int4",
        "group": 32,
        "head": False,
        "same": 9,
        "total": 10,
        "same_more": 40,
        "total_more": 50,
        "identical": 1,
        "replies": 2,
        "prefix": 3.0,
        "samples": [],
    }
    table = render_quality(q)
    assert "INT4 layer weights, groups of 32 (GPTQ rounding, as served) against" in table
    assert "| 9/10 = 90.0% |" in table and "| 40/50 = 80.0% |" in table
    headed = render_quality(q | {"head": True})  # --quant-head
    assert "groups of 32 (GPTQ rounding, as served), the LM head too (nearest) against" in headed


def test_a_quantized_head_with_a_kv_cache_variant_is_refused_not_ignored(capsys):
    """--quant-head rounds the head with the layer weights; a KV-cache variant has none."""
    with pytest.raises(SystemExit) as exc:
        main(["--device", "cuda", "--quantize", "weights,kv-fp8", "--quant-head"])
    assert exc.value.code == 2
    assert "--quant-head quantizes the LM head with the weights" in capsys.readouterr().err


def test_rows_rounded_for_w8a8_are_what_the_fp8_rows_kernel_gives():
    """``weights-nearest-a8`` rounds each FP8 Linear's rows as ``kernels.fp8_rows`` does (one
    scale per row, its largest magnitude at 448), by a hook on every FP8 Linear and nothing
    else."""
    import torch

    from voicert.bench.fp8 import fp8_rows_reference, round_linear_rows
    from voicert.engine.gpu.fp8 import Fp8Linear

    g = torch.Generator().manual_seed(3)
    x = torch.randn(4, 64, generator=g) * torch.tensor([[1e-3], [1.0], [30.0], [0.0]])
    got = fp8_rows_reference(x)
    scale = x.abs().amax(1, keepdim=True).clamp(min=1e-12) / 448.0
    assert torch.equal(got, (x / scale).to(torch.float8_e4m3fn).float() * scale)
    assert torch.equal(got[3], x[3]) and not torch.equal(got, x)
    # e4m3: 3 mantissa bits; below its smallest normal (2^-6 of the scale), steps of 2^-9
    assert (got - x).abs().le(torch.maximum(x.abs() / 16, scale * 2**-10)).all()
    model = torch.nn.Sequential(
        Fp8Linear.from_linear(torch.nn.Linear(64, 32)), torch.nn.Linear(32, 8)
    )
    plain = model(x)
    assert round_linear_rows(model) == 1
    fp8 = model[0]
    assert torch.equal(model(x), model[1](fp8.forward(fp8_rows_reference(x)))) and not torch.equal(
        model(x), plain
    )


def test_rows_rounded_for_w4a8_are_int8_in_the_weights_groups():
    """``int4-gguf-a8`` rounds each INT4 Linear's rows to int8, a scale per row and group of the
    weights' group (the largest magnitude at 127), by a hook on INT4 Linears only."""
    import torch

    from voicert.bench.fp8 import round_int4_rows
    from voicert.engine.gpu.int4 import Int4Linear, int8_groups

    g = torch.Generator().manual_seed(4)
    x = torch.randn(3, 64, generator=g)
    x[1, 32:] *= 100.0  # a group of its own range
    x[2, :32] = 0.0
    got = int8_groups(x, 32)
    for row, lo in ((0, 0), (0, 32), (1, 0), (1, 32)):
        part, want = x[row, lo : lo + 32], got[row, lo : lo + 32]
        scale = part.abs().max() / 127
        assert torch.equal(want, torch.round(part / scale) * scale)
        assert torch.allclose(want.abs().max(), part.abs().max())  # (127 steps of the scale)
        assert (want - part).abs().max() <= scale / 2
    assert torch.equal(got[2, :32], x[2, :32])
    model = torch.nn.Sequential(
        Int4Linear.from_linear(torch.nn.Linear(64, 16), None, 32), torch.nn.Linear(16, 4)
    )
    assert round_int4_rows(model) == 1
    lin = model[0]
    assert torch.equal(model(x), model[1](lin.forward(int8_groups(x, 32))))


def test_served_w4a8_rounds_only_one_row_inputs_as_the_kernel_does():
    """``int4-gguf-a8-served`` rounds an INT4 Linear's input only where it is one row (a
    one-stream decode step, as ``llm.int4_activations: int8`` serves it), with the kernel's
    rounding; a prompt's rows pass as they are."""
    import torch

    from voicert.bench.fp8 import round_int4_rows
    from voicert.engine.gpu.int4 import Int4Linear, int8_groups

    g = torch.Generator().manual_seed(5)
    lin = Int4Linear.from_linear(torch.nn.Linear(64, 16), None, 32)
    one, rows = torch.randn(1, 1, 64, generator=g), torch.randn(3, 64, generator=g)
    want_one, want_rows = lin(int8_groups(one, 32)), lin(rows)
    assert round_int4_rows(torch.nn.Sequential(lin), one_row=True) == 1
    assert torch.equal(lin(one), want_one) and not torch.equal(want_one, lin.forward(one))
    assert torch.equal(lin(rows), want_rows)


def test_served_w8a8_rounds_inputs_of_two_or_more_rows_only():
    """``weights-a8-served`` rounds an FP8 Linear's input to FP8 a row at a time where it has two
    or more rows (kernels.fp8_mm, fp8_scaled_mm), and leaves one row as it is (kernels.gemv)."""
    import torch

    from voicert.bench.fp8 import fp8_rows_reference, round_linear_rows
    from voicert.engine.gpu.fp8 import Fp8Linear

    g = torch.Generator().manual_seed(6)
    lin = Fp8Linear.from_linear(torch.nn.Linear(64, 16))
    one, rows = torch.randn(1, 1, 64, generator=g), torch.randn(2, 3, 64, generator=g)
    want_one, want_rows = lin(one), lin(fp8_rows_reference(rows))
    assert not torch.equal(want_rows, lin(rows))
    assert round_linear_rows(torch.nn.Sequential(lin), served=True) == 1
    assert torch.equal(lin(one), want_one) and torch.equal(lin(rows), want_rows)
