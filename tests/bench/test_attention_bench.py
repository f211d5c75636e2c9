"""bench/attention.py off the GPU: its cases, its pools (the engine's paged layout, re-paged for
128-token pages without changing a row's keys), and the engine's own attention over them equal to
float32 SDPA over exactly each row's keys. The timings themselves need a CUDA GPU."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():  # kernels imported here decorated for Triton's interpreter,
    os.environ["TRITON_INTERPRET"] = "1"  # as tests/engine/test_kernels.py runs them

from voicert.bench import attention as bench


def test_a_case_is_batch_by_new_by_context_and_names_its_phase():
    assert bench.Case.parse("8x1x600") == bench.Case(8, 1, 600)
    assert [bench.Case.parse(c).phase for c in ("8x1x600", "1x3x600", "1x128x600")] == [
        "decode",
        "verify",
        "prefill",
    ]
    for bad in ("8x1", "8x700x600", "0x1x10", "ax1x2"):
        with pytest.raises(ValueError, match="case"):
            bench.Case.parse(bad)


@pytest.mark.parametrize("case", ["1x1x40", "3x1x33", "2x5x50", "2x17x17"])
def test_the_engines_attention_over_the_pool_equals_sdpa_over_each_rows_keys(case):
    heads = (4, 2, 8)
    pool = bench.make_pool(bench.Case.parse(case), heads, 16, torch.float32, "cpu")
    ref = bench.reference(pool, heads)
    ours = bench.backend("gather+sdpa", pool, heads)()
    assert ours.shape == ref.shape and torch.allclose(ours, ref, atol=1e-5)
    # the same keys laid out in 128-token pages give the same attention
    assert torch.allclose(bench.reference(bench.repage(pool, 128), heads), ref, atol=1e-6)
    # and a row's keys are its own: another row's pool order changes the answer
    other = bench.make_pool(bench.Case.parse(case), heads, 16, torch.float32, "cpu", seed=1)
    assert not torch.allclose(bench.reference(other, heads), ref)


def test_bad_options_are_usage_errors_and_no_gpu_is_a_message(capsys, monkeypatch):
    for argv in (["--cases", "8x1"], ["--backends", "magic"], ["--block-size", "12"]):
        with pytest.raises(SystemExit) as exc:
            bench.main(argv)
        assert exc.value.code == 2
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert bench.main(["--cases", "1x1x16"]) == 2
    err = capsys.readouterr().err
    assert "needs a CUDA GPU" in err and "Traceback" not in err


def test_triton_at_keys_and_stages_sets_the_decode_tiles_for_the_call_only(monkeypatch):
    """``triton@KEYS[:STAGES[:WARPS]]``: our kernel launched with a decode program's keys per
    step (and its loop's stages and its warps) set while it is called (so also under a graph's capture), then
    put back; a malformed name is a usage error. (That the kernel computes the same with any
    of them is tests/engine/test_kernels.py's.)"""
    from voicert.engine.gpu import kernels

    assert bench.triton_tiles("triton@64:2") == (64, 2, 0)
    assert bench.triton_tiles("triton@128:2:8") == (128, 2, 8)
    assert bench.triton_tiles("triton@32") == (32, 0, 0)
    assert bench.triton_tiles("triton") is None and bench.triton_tiles("flash@128") is None
    bad = ("triton@48", "triton@64:0", "triton@64:9", "triton@x", "triton@64:", "triton@64:2:6")
    for name in (*bad, "triton@64:2:8:1"):
        with pytest.raises(ValueError, match="triton@KEYS"):
            bench.triton_tiles(name)
    mod, seen = kernels.attention, []

    def fake(qkv, *args):
        seen.append((mod._DECODE_BLOCK_N, mod._DECODE_STAGES, mod._DECODE_WARPS))
        return qkv

    monkeypatch.setattr(kernels, "paged_attention", fake)
    pool = bench.make_pool(bench.Case.parse("3x1x70"), (4, 2, 16), 16, torch.float32, "cpu")
    bench.backend("triton@16:2:8", pool, (4, 2, 16))()
    bench.backend("triton", pool, (4, 2, 16))()
    assert seen == [(16, 2, 8), (0, 0, 0)]
    assert (mod._DECODE_BLOCK_N, mod._DECODE_STAGES, mod._DECODE_WARPS) == (0, 0, 0)
    with pytest.raises(SystemExit) as exc:
        bench.main(["--backends", "triton@48"])
    assert exc.value.code == 2
