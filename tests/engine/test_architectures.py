"""Architectures beyond Llama, each on a tiny random config written as an HF checkpoint by
transformers itself: Qwen3 (q/k RMSNorm per head before RoPE, no q/k/v biases), Phi-3 (fused
qkv and gate/up projections in the checkpoint), Gemma 2 (soft-capping, sliding-window layers,
GeGLU, scaled embeddings, norms after each sublayer) and Gemma 3 (q/k norms, a RoPE of their own
for the sliding layers, linear RoPE scaling on the full ones). For each: greedy tokens identical to transformers'
generate over 32 tokens, batched == one at a time, eager == the served CPU trace, cached ==
uncached."""

from __future__ import annotations

import random

import pytest
import torch

from voicert.core.llm import GenerationRequest
from voicert.engine.core.kv_cache import BlockManager
from voicert.engine.core.runner import ModelRunner
from voicert.engine.core.scheduler import Scheduler, SchedulerConfig
from voicert.engine.core.sequence import Sequence
from voicert.engine.models.registry import load_model

NEW = 32


def tiny(kind: str):
    """(config, model class) of a tiny ``kind`` model."""
    import transformers as t

    common = dict(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    if kind == "qwen3":
        return t.Qwen3Config(
            **common,
            head_dim=32,
            rms_norm_eps=1e-6,
            rope_theta=1e6,
            tie_word_embeddings=False,
            attention_bias=False,
        ), t.Qwen3ForCausalLM
    if kind == "gemma2":  # a window shorter than the prompts (the sliding layers cut keys off)
        # and a cap the tiny model's attention scores reach
        return t.Gemma2Config(
            **common,
            head_dim=16,
            query_pre_attn_scalar=24,
            attn_logit_softcapping=0.5,
            final_logit_softcapping=30.0,
            sliding_window=24,
            tie_word_embeddings=False,
        ), t.Gemma2ForCausalLM
    if kind == "gemma3":  # sliding and full layers, each with its own RoPE base; full ones scaled
        return t.Gemma3TextConfig(
            **common,
            head_dim=16,
            query_pre_attn_scalar=24,
            sliding_window=24,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"],
            rope_parameters={
                "sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
                "full_attention": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0},
            },
            tie_word_embeddings=False,
        ), t.Gemma3ForCausalLM
    return t.Phi3Config(**common, rms_norm_eps=1e-5, tie_word_embeddings=False), t.Phi3ForCausalLM


@pytest.fixture(scope="module", params=["qwen3", "phi3", "gemma2", "gemma3"])
def checkpoint(request, tmp_path_factory):
    cfg, cls = tiny(request.param)
    torch.manual_seed(0)
    model = cls(cfg).eval()
    with torch.no_grad():  # norms away from 1 so that a missing or misplaced norm shows
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):  # (Gemma's scale is 1 + weight)
                p.uniform_(-0.5, 0.5) if request.param.startswith("gemma") else p.uniform_(0.5, 1.5)
            elif request.param == "gemma2" and name.endswith(("q_proj.weight", "k_proj.weight")):
                p.mul_(10)  # attention scores large enough for the soft cap to bend them
        # wide logit margins: a random model's near-ties would let float rounding (a prefill in
        # one piece or two) pick another token, which says nothing about the architecture
        model.lm_head.weight.mul_(3 if request.param == "gemma2" else 30)  # (Gemma 2: its cap)
    out = tmp_path_factory.mktemp(f"{request.param}-tiny")
    model.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def prompts():
    rng = random.Random(3)
    return [[rng.randrange(1, 512) for _ in range(n)] for n in (5, 19, 40)]


def decode(model, prompts, torchscript=False, engine=None):
    """Our greedy tokens for ``prompts`` decoded together, EOS ignored, one list per prompt.
    ``engine``: (scheduler, runner) to reuse, with its prefix cache and KV pool."""
    sched, runner = engine or fresh(model, torchscript)
    seqs = [Sequence(GenerationRequest(f"r{random.random()}", [], NEW), list(p)) for p in prompts]
    for s in seqs:
        sched.add(s)
    while sched.has_work():
        step, _ = sched.schedule()
        sched.postprocess(step, runner.run(step))
    return [s.tokens[len(s.prompt) :] for s in seqs]


def fresh(model, torchscript=False):
    """A scheduler (its block manager: the prefix cache) and a runner (the KV pool it indexes)."""
    return (
        Scheduler(BlockManager(128, 16), SchedulerConfig(), stop_ids=set()),
        ModelRunner(model, 128, 16, torchscript=torchscript),
    )


def test_greedy_equals_transformers_over_32_tokens(checkpoint, prompts):
    from transformers import AutoModelForCausalLM

    ours = decode(load_model(checkpoint), prompts)
    ref_model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    ref_model.generation_config.eos_token_id = None
    for prompt, got in zip(prompts, ours):
        with torch.inference_mode():
            out = ref_model.generate(
                torch.tensor([prompt]), max_new_tokens=NEW, do_sample=False, pad_token_id=0
            )
        assert got == out[0, len(prompt) :].tolist()


def test_batched_equals_one_at_a_time_and_the_trace_equals_eager(checkpoint, prompts):
    model = load_model(checkpoint)
    together = decode(model, prompts)
    assert together == [decode(model, [p])[0] for p in prompts]
    assert decode(model, prompts, torchscript=True) == together


def test_cached_equals_uncached(checkpoint, prompts):
    model = load_model(checkpoint)
    engine = fresh(model)
    blocks = engine[0].blocks
    longer = (
        prompts[2] + prompts[1]
    )  # shares the first 40 tokens (two whole blocks) with one before
    decode(model, [prompts[2]], engine=engine)
    hits_before = blocks.stats.hits
    cached = decode(model, [longer], engine=engine)
    assert blocks.stats.hits >= hits_before + 32  # its first two blocks came from the cache
    assert cached == decode(model, [longer])  # a fresh cache


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_served_gpu_path_gives_the_cpu_paths_tokens(checkpoint, prompts):
    """As served on a GPU (fp32, CUDA graphs, the fused kernels and PDL where the architecture
    takes them: Phi-3 and Qwen3 run Llama's fused layers, Gemma its torch layers in graphs):
    the tokens of the eager CPU path above (itself equal to transformers'), batched and one at a
    time."""
    import asyncio

    from voicert.bench.shapes import NullTokenizer
    from voicert.engine.clients.llm_engine import LLMEngine
    from voicert.engine.settings import EngineConfig

    want = decode(load_model(checkpoint), prompts)
    model = load_model(checkpoint, torch.float32, "cuda")
    engine = LLMEngine(
        "",
        EngineConfig(
            device="cuda",
            dtype="float32",
            num_blocks=256,
            cuda_graphs=True,
            fused_kernels=True,
            max_batch=8,
            max_context_tokens=512,
        ),
        model=model,
        tokenizer=NullTokenizer(model.cfg.vocab_size),
    )

    async def one(i, p):
        req = GenerationRequest(f"a{i}-{random.random()}", [], NEW, ignore_eos=True, prompt_ids=p)
        return [e.token_id async for e in engine.submit(req) if e.finish_reason is None]

    async def together():
        return await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))

    try:
        assert engine.core.runner.graphs is not None
        assert asyncio.run(together()) == want
        assert [asyncio.run(one(i, p)) for i, p in enumerate(prompts)] == want
    finally:
        engine.close()
