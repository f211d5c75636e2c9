"""The engine bench's figures: one definition for every engine measured (ours, transformers, vLLM
in bench/vllm_side.py), checked on a scripted stream whose token times are known."""

import argparse

from voicert.bench import engine as bench
from voicert.bench import shapes, streams
from voicert.bench.vllm_side import write_shape


def scripted(first_ms: float, step_ms: float):
    """A stream whose first token comes ``first_ms`` after submit and the rest ``step_ms`` apart
    (times in ns, as a real stream's receive times)."""
    calls = []

    async def stream(prompt, new):
        calls.append((len(prompt), new))
        t0 = 10**12 + len(calls) * 10**9
        first = t0 + int(first_ms * 1e6)
        return [first + int(i * step_ms * 1e6) for i in range(new)], t0

    return stream, calls


async def test_measure_reports_ttft_and_decode_tpot_by_row_name():
    stream, calls = scripted(first_ms=7.5, step_ms=2.0)
    counter = iter(range(10**6))
    figures = await streams.measure(
        stream,
        lambda n: [next(counter) % 50 for _ in range(n)],
        reps=4,
        streams=[1, 3],
        new=9,
        prompt_tokens=10,
    )
    assert figures[streams.TTFT_600 + " (P50)"] == 7.5 and figures[streams.TTFT_TURN] == 7.5
    for n in (1, 3):
        assert abs(figures[streams.tpot_decode(n)] - 2.0) < 1e-9
        assert abs(figures[streams.tpot_all(n)] - 2.0) < 1e-9
        assert figures[streams.tokens_per_s(n)] > 0
    # the cached-prefix prompts: a warm-up, then reps, each 500 + 100 (and 150 + 20) tokens
    assert calls[:5] == [(600, 1)] * 5 and calls[5:10] == [(170, 1)] * 5
    assert (10, 9) in calls
    # each stream count is warmed at its full count (steps of that many rows compile first),
    # then timed
    tail = calls[10:]
    assert (
        tail
        == [(10, streams.WARM_TOKENS)] + [(10, 9)] + [(10, streams.WARM_TOKENS)] * 3 + [(10, 9)] * 3
    )


def test_the_table_names_the_engine_beside_ours_and_its_ratios():
    args = argparse.Namespace(
        device="cuda",
        dtype="bfloat16",
        fp8=True,
        int4=False,
        int4_group=128,
        q4km=False,
        int4_activations="model",
        fp8_activations="fp8",
        quant_head=False,
        cuda_graphs=True,
        fused_kernels=True,
        overlap=True,
        torchscript=False,
        int8=False,
        prompt_tokens=100,
        new_tokens=128,
        prefill_attention="flash",
        prefill_token_budget=2048,
    )
    rows = [
        bench.Row(streams.tpot_decode(1), 1.0, 1.5, "ms"),
        bench.Row(streams.tokens_per_s(8), 200.0, 100.0, "tok/s"),
        bench.Row(streams.tpot_all(1), 1.0, None, "ms"),
    ]
    text = bench.render(
        "llama-1b-random", args, {"rows": rows, "spec": [], "int8": None}, "vLLM 0.26.0 fp8"
    )
    assert "| metric | voicert | vLLM 0.26.0 fp8 | ratio (x better) |" in text
    assert "FP8 weights" in text and "prefill attention flash" in text
    assert "prefill steps of 2048 padded tokens" in text
    q4km = argparse.Namespace(**{**vars(args), "fp8": False, "int4": True, "int4_group": 32})
    text = bench.render(
        "llama-8b-random",
        argparse.Namespace(**{**vars(q4km), "q4km": True}),
        {"rows": rows, "spec": [], "int8": None},
    )
    assert "INT4 weights (groups of 32); as llm.int4_gguf serves a Q4_K_M file" in text
    assert "| 1.00 ms | 1.50 | 1.50x |" in text and "| 200.00 tok/s | 100.00 | 2.00x |" in text
    assert "| 1.00 ms | - | - |" in text


def test_vllm_gets_the_benchs_own_shape_as_a_llama_config(tmp_path):
    import json

    out = write_shape(shapes.SHAPES["llama-8b-random"], tmp_path / "8b")
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["hidden_size"] == 4096
    assert cfg["num_hidden_layers"] == 32 and cfg["torch_dtype"] == "bfloat16"


def test_a_qwen3_shape_is_qwen3_for_both_engines(tmp_path):
    import json

    from voicert.engine.models.llama import LlamaConfig

    cfg = LlamaConfig.from_hf(shapes.shape_config("qwen3-8b-random"))
    assert cfg.qk_norm and not cfg.attention_bias and cfg.num_layers == 36
    assert not LlamaConfig.from_hf(shapes.shape_config("llama-8b-random")).qk_norm
    out = write_shape(shapes.SHAPES["qwen3-8b-random"], tmp_path / "qwen3")
    written = json.loads((out / "config.json").read_text())
    assert written["architectures"] == ["Qwen3ForCausalLM"] and written["model_type"] == "qwen3"


def test_bad_options_are_usage_errors_before_any_model_loads(capsys):
    import pytest

    from voicert.bench import fp8

    for main, argv in (
        (bench.main, ["--device", "cpu", "--fp8"]),
        (bench.main, ["--against", "sglang"]),
        (bench.main, ["--device", "cpu", "--against", "sdpa-prefill"]),
        (bench.main, ["--device", "cuda", "--against", "model-kv"]),
        (bench.main, ["--device", "cuda", "--fp8", "--int4"]),
        (bench.main, ["--device", "cuda", "--int4", "--against", "vllm"]),
        (fp8.main, ["--blocks", "16x32x256"]),
        (fp8.main, ["--kernel", "int4", "--blocks", "16x32x256x4x4x2"]),
        (fp8.main, ["--shapes", "llama-70b"]),
        (fp8.main, ["--quantize", "kv-int8,activations"]),
    ):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2, argv
    err = capsys.readouterr().err
    assert "--fp8, --int4 and --kv-cache int8 | fp8 are GPU options" in err
    assert "5 or 6 numbers each for fp8" in err and "4 or 5 numbers each for int4" in err
    assert "two quantizations: choose one" in err and "vLLM needs a GPTQ checkpoint" in err
    assert "--against model-kv compares a one-byte KV cache" in err and "--quantize: any of" in err
    assert "--against sdpa-prefill" in err and "--fused-kernels" in err
    assert "bad --shapes" in err and "invalid choice: 'sglang'" in err


def test_the_vllm_side_says_why_it_failed():
    """Here vLLM is not installed: the child's own error comes back as the reason."""
    import pytest

    from voicert.bench.vllm_side import measure_in_child

    with pytest.raises(RuntimeError, match="(?s)the vLLM side failed.*No module named 'vllm'"):
        measure_in_child("llama-1b-random", "bfloat16", False, [1], 4, 10, 1, timeout_s=120)


def test_on_a_gpu_the_bench_prefills_as_the_gpu_config_serves():
    """The bench's engine on a GPU takes configs/gpu.yaml's prefill budget, not the CPU
    default's (64 streams' 100-token prompts in one step each, 64 steps)."""
    from pathlib import Path

    from voicert.config import load_config

    root = Path(__file__).resolve().parents[2]
    gpu = load_config(root / "configs" / "gpu.yaml", environ={})
    assert gpu.llm.prefill_token_budget == bench.GPU_PREFILL_BUDGET
    assert load_config(environ={}).llm.prefill_token_budget < bench.GPU_PREFILL_BUDGET


def test_the_bench_runs_end_to_end_with_speculation_on_a_tiny_random_model(monkeypatch, capsys):
    """``python -m voicert.bench.engine`` as run by hand (n-gram speculation on, as by
    default): the speculating engine is built on the built model, and the table prints. A path that is not a
    model is one line and exit status 2, not a traceback."""
    tiny = dict(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        rms_norm_eps=1e-5,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
    )
    monkeypatch.setitem(shapes.SHAPES, "tiny-random", tiny)  # (the dict bench.engine reads)
    argv = ["--model", "tiny-random", "--device", "cpu", "--streams", "2", "--new-tokens", "4"]
    assert bench.main([*argv, "--reps", "1", "--spec", "2", "--no-baseline"]) == 0
    out = capsys.readouterr().out
    assert "prefill steps of 128 padded tokens" in out  # (the spec table needs a tokenizer)
    assert bench.main(["--model", "/nowhere/model", "--device", "cpu", "--no-baseline"]) == 2
    assert "bench.engine: models.llm: /nowhere/model does not exist" in capsys.readouterr().err
