"""GPU time-sharing benchmark: ``python -m voicert.bench.contention``.

In the server the LLM engine (its own process) and Whisper (CTranslate2, the server process) share
one GPU. Kernels of two processes do not run side by side: the GPU time-slices between their
contexts. A step launched kernel by kernel from Python leaves the GPU idle between launches, so
the other context gets the GPU back each time and the step stretches; a replayed CUDA graph is
one submission. This benchmark measures exactly that: the engine's TTFT (one request, 100 new tokens
after 500 cached) and TPOT, eager and with CUDA graphs, with a second process idle or keeping the
GPU busy (Whisper via faster-whisper, or a matmul loop), and prints a Markdown table.

    python -m voicert.bench.contention --model llama-1b-random --hog whisper:/root/models/tiny
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import time

import numpy as np


def _hog(spec: str, active, ready, count) -> None:
    """Child process: keep the GPU busy while ``active`` is set; count iterations."""
    if spec.startswith("whisper:"):
        from faster_whisper import WhisperModel

        model = WhisperModel(spec.split(":", 1)[1], device="cuda", compute_type="float16")
        audio = (np.random.default_rng(0).standard_normal(32000) * 0.05).astype(np.float32)

        def once() -> None:
            segments, _ = model.transcribe(
                audio, beam_size=1, without_timestamps=True, condition_on_previous_text=False
            )
            list(segments)
    else:
        import torch

        a = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)

        def once() -> None:
            for _ in range(16):
                a @ a
            torch.cuda.synchronize()

    once()
    ready.set()
    while True:
        active.wait()
        once()
        with count.get_lock():
            count.value += 1


async def _request(engine, prompt: list[int], new: int) -> tuple[float, float]:
    """(TTFT ms, mean TPOT ms) of one request, client side."""
    from voicert.core.llm import GenerationRequest

    req = GenerationRequest(
        f"c-{time.perf_counter_ns()}", [], new, ignore_eos=True, prompt_ids=prompt
    )
    times = [ev_time async for ev_time in _times(engine.submit(req))]
    return (times[0] - req.submit_ns) / 1e6, (times[-1] - times[0]) / 1e6 / max(len(times) - 1, 1)


async def _times(stream):
    async for ev in stream:
        if ev.finish_reason is None:
            yield time.perf_counter_ns()


def _measure(engine, rng, reps: int, new: int) -> tuple[list[float], list[float]]:
    prefix = rng.integers(100, 30000, 500).tolist()

    async def run():
        await _request(engine, prefix + rng.integers(100, 30000, 100).tolist(), 4)  # cache it
        out = [
            await _request(engine, prefix + rng.integers(100, 30000, 100).tolist(), new)
            for _ in range(reps)
        ]
        return [a for a, _ in out], [b for _, b in out]

    return asyncio.run(run())


def main(argv: list[str] | None = None) -> int:
    import torch

    from voicert.bench.shapes import SHAPES, NullTokenizer, shape_config
    from voicert.bench.streams import pct
    from voicert.engine.clients.llm_engine import LLMEngine
    from voicert.engine.models.llama import LlamaConfig, load_llama, random_llama
    from voicert.engine.settings import EngineConfig

    ap = argparse.ArgumentParser(prog="python -m voicert.bench.contention")
    ap.add_argument("--model", default="llama-1b-random", help="a SHAPES name or an HF dir")
    ap.add_argument("--hog", default="matmul", help="whisper:CT2_DIR or matmul")
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument("--new-tokens", type=int, default=16)
    args = ap.parse_args(argv)
    if args.model in SHAPES:
        label = f"{args.model} (RANDOM WEIGHTS, timing only)"
        model = random_llama(LlamaConfig.from_hf(shape_config(args.model)), torch.bfloat16, "cuda")
    else:
        label, model = args.model, load_llama(args.model, torch.bfloat16, "cuda")
    tok = NullTokenizer(model.cfg.vocab_size)
    ctx = mp.get_context("spawn")
    active, ready, count = ctx.Event(), ctx.Event(), ctx.Value("l", 0)
    hog = ctx.Process(target=_hog, args=(args.hog, active, ready, count), daemon=True)
    hog.start()
    if not ready.wait(300):
        raise SystemExit("the GPU hog did not start")
    rows = []
    for graphs in (False, True):
        engine = LLMEngine(
            "",
            EngineConfig(
                device="cuda",
                dtype="bfloat16",
                kv_memory_gb=2,
                cuda_graphs=graphs,
                max_batch=8,
                max_context_tokens=2048,
                own_stream=True,
            ),
            model=model,
            tokenizer=tok,
        )
        try:
            for busy in (False, True):
                (active.set if busy else active.clear)()
                time.sleep(0.5)
                before, t0 = count.value, time.perf_counter()
                ttft, tpot = _measure(engine, np.random.default_rng(0), args.reps, args.new_tokens)
                rate = (count.value - before) / (time.perf_counter() - t0)
                rows.append((("CUDA graphs" if graphs else "eager"), busy, ttft, tpot, rate))
        finally:
            active.clear()
            engine.close()
    hog.kill()
    print(f"\n**{label}**, bf16, {torch.cuda.get_device_name()}; other process: {args.hog}\n")
    print(
        "| engine steps | other process | TTFT P50 ms | TTFT P99 ms | TPOT P50 ms | TPOT P99 ms "
        "| other's iterations/s |"
    )
    print("|---|---|---:|---:|---:|---:|---:|")
    for name, busy, ttft, tpot, rate in rows:
        print(
            f"| {name} | {'busy' if busy else 'idle'} | {pct(ttft, 50):.1f} | {pct(ttft, 99):.1f} "
            f"| {pct(tpot, 50):.2f} | {pct(tpot, 99):.2f} | {rate:.1f} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
