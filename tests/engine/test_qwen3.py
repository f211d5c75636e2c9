"""Qwen3 (q/k RMSNorm per head before RoPE, no q/k/v biases) on a tiny random config written as an
HF checkpoint by transformers itself: greedy tokens identical to transformers' generate over 32
tokens, cached == uncached, batched == one at a time, eager == the served CPU trace."""

from __future__ import annotations

import random

import pytest
import torch

from voicert.engine.base import GenerationRequest
from voicert.engine.kv_cache import BlockManager
from voicert.engine.models.registry import load_model
from voicert.engine.runner import ModelRunner
from voicert.engine.scheduler import Scheduler, SchedulerConfig
from voicert.engine.sequence import Sequence

NEW = 32


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                      max_position_embeddings=1024, rms_norm_eps=1e-6, rope_theta=1e6,
                      tie_word_embeddings=True, attention_bias=False)
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(cfg).eval()
    with torch.no_grad():  # norms away from 1 so that a missing q/k norm shows in the tokens
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
    out = tmp_path_factory.mktemp("qwen3-tiny")
    model.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def prompts():
    rng = random.Random(3)
    return [[rng.randrange(1, 512) for _ in range(n)] for n in (5, 19, 40)]


def decode(model, prompts, torchscript=False, blocks=None, sched=None):
    """Our greedy tokens for ``prompts`` decoded together, EOS ignored: {prompt index: tokens}."""
    blocks = blocks or BlockManager(128, 16)
    sched = sched or Scheduler(blocks, SchedulerConfig(), stop_ids=set())
    runner = ModelRunner(model, 128, 16, torchscript=torchscript)
    seqs = [Sequence(GenerationRequest(f"r{random.random()}", [], NEW), list(p)) for p in prompts]
    for s in seqs:
        sched.add(s)
    while sched.has_work():
        step, _ = sched.schedule()
        sched.postprocess(step, runner.run(step))
    return [s.tokens[len(s.prompt):] for s in seqs]


def test_qwen3_greedy_equals_transformers_over_32_tokens(qwen3_dir, prompts):
    from transformers import AutoModelForCausalLM

    ours = decode(load_model(qwen3_dir), prompts)
    ref_model = AutoModelForCausalLM.from_pretrained(qwen3_dir, dtype=torch.float32).eval()
    ref_model.generation_config.eos_token_id = None
    for prompt, got in zip(prompts, ours):
        with torch.inference_mode():
            out = ref_model.generate(torch.tensor([prompt]), max_new_tokens=NEW, do_sample=False,
                                     pad_token_id=0)
        assert got == out[0, len(prompt):].tolist()


def test_qwen3_batched_equals_one_at_a_time_and_the_trace_equals_eager(qwen3_dir, prompts):
    model = load_model(qwen3_dir)
    together = decode(model, prompts)
    assert together == [decode(model, [p])[0] for p in prompts]
    assert decode(model, prompts, torchscript=True) == together


def test_qwen3_cached_equals_uncached(qwen3_dir, prompts):
    model = load_model(qwen3_dir)
    blocks = BlockManager(128, 16)
    sched = Scheduler(blocks, SchedulerConfig(), stop_ids=set())
    longer = prompts[2] + prompts[1]  # shares the first 40 tokens (two whole blocks) with one before
    decode(model, [prompts[2]], blocks=blocks, sched=sched)
    hits_before = blocks.stats.hits
    cached = decode(model, [longer], blocks=blocks, sched=sched)
    assert blocks.stats.hits >= hits_before + 32  # its first two blocks came from the cache
    assert cached == decode(model, [longer])  # a fresh cache
