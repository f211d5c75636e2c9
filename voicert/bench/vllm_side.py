"""vLLM measured the way ``voicert.bench.engine`` measures voicert: ``python -m
voicert.bench.engine --against vllm`` runs this module in a child process (before its own engine
loads, so the two never share the GPU's memory) and prints the two side by side.

vLLM runs as its streaming ``AsyncLLM`` (the engine behind its OpenAI server) with greedy
sampling, prefix caching on, token-id prompts and ``ignore_eos``: each request's tokens are timed
as they reach this process, through the same :func:`voicert.bench.engine.measure` (same prompts
from the same seed, same rows) as voicert's own engine. A random-weight shape
(``--model llama-1b-random`` ...) is written as a config.json and loaded with
``load_format="dummy"``; a model directory loads its real weights. ``--fp8``: vLLM's
``quantization="fp8"`` (FP8 weights, dynamic per-token activation scales).

Needs vLLM (0.26.0 on the GPU machine: scripts/gpu/fetch-vllm.sh). Usage, standalone:
``python -m voicert.bench.vllm_side --model llama-1b-random --json out.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM"}


def write_shape(shape: dict, out_dir: Path) -> Path:
    """A config.json for vLLM's dummy loader: the shape's HF config (Llama unless it names its
    ``model_type``), bf16."""
    kind = shape.get("model_type", "llama")
    cfg = dict(
        shape,
        model_type=kind,
        architectures=[ARCHITECTURES[kind]],
        torch_dtype="bfloat16",
        bos_token_id=1,
        eos_token_id=2,
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(json.dumps(cfg, indent=1))
    return out_dir


def engine_args(model_dir: str, dummy: bool, fp8: bool, max_batch: int, dtype: str):
    """vLLM's engine settings for the bench: prefix caching, CUDA graphs (its default), room for
    the bench's widest level, half the GPU's memory."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    return AsyncEngineArgs(
        model=model_dir,
        load_format="dummy" if dummy else "auto",
        skip_tokenizer_init=True,
        dtype=dtype,
        gpu_memory_utilization=0.45,
        enable_prefix_caching=True,
        max_model_len=4096,
        max_num_seqs=max(max_batch, 8),
        quantization="fp8" if fp8 else None,
        disable_log_stats=True,
    )


def stream_fn(engine):
    """A :data:`voicert.bench.engine.StreamFn` over a vLLM ``AsyncLLM``."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind

    count = 0

    async def stream(prompt: list[int], new: int) -> tuple[list[int], int]:
        nonlocal count
        count += 1
        params = SamplingParams(
            max_tokens=new,
            min_tokens=new,
            ignore_eos=True,
            temperature=0.0,
            detokenize=False,
            output_kind=RequestOutputKind.DELTA,
        )
        times: list[int] = []
        t0 = time.perf_counter_ns()
        async for out in engine.generate(
            request_id=f"b{count}",
            prompt=TokensPrompt(prompt_token_ids=prompt),
            sampling_params=params,
        ):
            now = time.perf_counter_ns()
            times.extend([now] * len(out.outputs[0].token_ids))
        return times, t0

    return stream


async def run(args: argparse.Namespace) -> dict:
    from vllm.v1.engine.async_llm import AsyncLLM

    from voicert.bench.shapes import SHAPES
    from voicert.bench.streams import measure

    if args.model in SHAPES:
        model_dir = str(write_shape(SHAPES[args.model], Path(tempfile.mkdtemp()) / args.model))
        vocab, dummy = SHAPES[args.model]["vocab_size"], True
    else:
        from voicert.config import cache_dir, load_config
        from voicert.engine.loader import resolve_llm

        model_dir = str(resolve_llm(args.model, cache_dir(load_config(environ={}).models)))
        dummy = False
        vocab = json.loads((Path(model_dir) / "config.json").read_text())["vocab_size"]
    t0 = time.perf_counter()
    engine = AsyncLLM.from_engine_args(
        engine_args(model_dir, dummy, args.fp8, max(args.streams), args.dtype)
    )
    started = time.perf_counter() - t0
    rng = np.random.default_rng(0)  # the same prompts as voicert's side

    def tokens(n: int) -> list[int]:
        return rng.integers(100, min(vocab, 30000), n).tolist()

    try:
        figures = await measure(
            stream_fn(engine), tokens, args.reps, args.streams, args.new_tokens, args.prompt_tokens
        )
    finally:
        engine.shutdown()
    import vllm

    return {
        "engine": f"vLLM {vllm.__version__}" + (" fp8" if args.fp8 else ""),
        "startup_s": started,
        "figures": figures,
    }


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m voicert.bench.vllm_side")
    ap.add_argument("--model", default="llama-1b-random")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--fp8", action="store_true")
    ap.add_argument("--streams", default="1,8,32,64")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--prompt-tokens", type=int, default=100)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--json", required=True)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    args.streams = [int(s) for s in args.streams.split(",")]
    os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
    result = asyncio.run(run(args))
    Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


def measure_in_child(
    model: str,
    dtype: str,
    fp8: bool,
    streams: list[int],
    new_tokens: int,
    prompt_tokens: int,
    reps: int,
    timeout_s: float = 900,
) -> dict:
    """Run this module in a child process and return its result ({"engine", "startup_s",
    "figures": {row name: value}}). Raises RuntimeError with the child's last output lines when
    vLLM is missing or fails."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "vllm.json"
        cmd = [
            sys.executable,
            "-m",
            "voicert.bench.vllm_side",
            "--model",
            model,
            "--dtype",
            dtype,
            "--streams",
            ",".join(map(str, streams)),
            "--new-tokens",
            str(new_tokens),
            "--prompt-tokens",
            str(prompt_tokens),
            "--reps",
            str(reps),
            "--json",
            str(out),
        ]
        if fp8:
            cmd.append("--fp8")
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        if proc.returncode != 0 or not out.exists():
            tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
            raise RuntimeError(f"the vLLM side failed (exit {proc.returncode}):\n{tail}")
        return json.loads(out.read_text())


if __name__ == "__main__":
    sys.exit(main())
