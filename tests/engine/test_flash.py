"""Prefill attention by FlashAttention-4 (engine/models/flash.py) against gather + SDPA: the
same output on right-padded rows of any real length over any cached prefix, eagerly and replayed
from a CUDA graph, and in a served engine. The GPU checks need CUDA (Hopper or newer) and the
optional flash-attn-4 package; the CPU ones check the choice and its errors."""

from __future__ import annotations

import asyncio

import pytest
import torch

from voicert.config import ConfigError, LlmConfig
from voicert.engine.models import flash
from voicert.engine.models.layers import Attention, AttnInputs, SdpaRows
from voicert.engine.models.llama import LlamaConfig

HEADS, KV_HEADS, DIM, BLOCK = 32, 8, 64, 16


def test_flash_runs_only_where_it_can_and_a_bad_choice_names_the_key():
    assert "CUDA" in flash.unavailable("cpu", torch.bfloat16)
    with pytest.raises(ConfigError, match="llm.prefill_attention"):
        LlmConfig(prefill_attention="fast")


needs_flash = pytest.mark.skipif(
    not torch.cuda.is_available() or flash.unavailable("cuda", torch.bfloat16) is not None,
    reason="needs a Hopper GPU and flash-attn-4",
)


def layer() -> Attention:
    cfg = LlamaConfig(
        vocab_size=1,
        hidden_size=HEADS * DIM,
        intermediate_size=1,
        num_layers=1,
        num_heads=HEADS,
        num_kv_heads=KV_HEADS,
        head_dim=DIM,
        rms_norm_eps=1e-5,
        rope_theta=1e4,
        max_position=4096,
        tie_word_embeddings=True,
    )
    return Attention(cfg)


def rows(real: list[int], cached: list[int], width: int, g: torch.Generator):
    """Right-padded prefill rows: row b has real[b] new tokens after cached[b] cached ones."""
    b = len(real)
    per_row = -(-max(c + n for c, n in zip(cached, real)) // BLOCK)
    nb = 1 + b * per_row
    k = torch.randn(nb, BLOCK, KV_HEADS, DIM, generator=g).cuda().bfloat16()
    v = torch.randn(nb, BLOCK, KV_HEADS, DIM, generator=g).cuda().bfloat16()
    tables = (1 + torch.randperm(nb - 1, generator=g)).view(b, per_row).cuda()
    positions = torch.zeros(b, width, dtype=torch.long)
    for i, (n, c) in enumerate(zip(real, cached)):
        positions[i, :n] = c + torch.arange(n)
    q = torch.randn(b, width, HEADS, DIM, generator=g).cuda().bfloat16()
    inp = AttnInputs(positions.cuda(), torch.zeros(b * width, dtype=torch.long).cuda(), tables)
    return q, inp, k, v


@needs_flash
@pytest.mark.parametrize(
    "real,cached", [([64], [0]), ([5, 64, 1, 33], [0, 500, 17, 96]), ([48, 48], [300, 0])]
)
def test_flash_rows_equal_sdpa_rows_on_padded_rows(real, cached):
    g = torch.Generator().manual_seed(sum(real))
    q, inp, k, v = rows(real, cached, 64, g)
    attn = layer()
    ours = flash.FlashRows(inp)(attn, q, inp, k, v)  # [B, Q, H * D]
    want = SdpaRows(inp, BLOCK, torch.bfloat16)(attn, q, inp, k, v)
    for b, n in enumerate(real):
        torch.testing.assert_close(ours[b, :n].float(), want[b, :n].float(), atol=2e-2, rtol=2e-2)
        assert not ours[b, n:].any()  # padding rows are zero, never left unwritten


@needs_flash
def test_flash_rows_replayed_from_a_graph_follow_new_rows():
    g = torch.Generator().manual_seed(3)
    attn = layer()
    q, inp, k, v = rows([40, 7], [0, 200], 64, g)
    static = AttnInputs(inp.positions.clone(), inp.slots, inp.block_tables.clone())
    out = flash.FlashRows(static)(attn, q, static, k, v)  # warm-up: compiles the kernel
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = flash.FlashRows(static)(attn, q, static, k, v)
    moved = torch.zeros_like(static.positions)  # new rows within the same blocks (208 a row)
    moved[0, :12] = 150 + torch.arange(12, device="cuda")
    moved[1, :] = 100 + torch.arange(64, device="cuda")
    static.positions.copy_(moved)
    q.copy_(torch.randn(q.shape, generator=g).to(q))
    graph.replay()
    want = SdpaRows(static, BLOCK, torch.bfloat16)(attn, q, static, k, v)
    for b, n in enumerate([12, 64]):
        torch.testing.assert_close(out[b, :n].float(), want[b, :n].float(), atol=2e-2, rtol=2e-2)
        assert not out[b, n:].any()


@needs_flash
def test_a_served_engine_prefills_with_flash_and_agrees_with_sdpa():
    from voicert.bench.shapes import NullTokenizer, shape_config
    from voicert.core.llm import GenerationRequest
    from voicert.engine.clients.llm_engine import LLMEngine
    from voicert.engine.models.llama import random_llama
    from voicert.engine.settings import EngineConfig

    model = random_llama(
        LlamaConfig.from_hf(dict(shape_config("llama-1b-random"), num_hidden_layers=4)),
        torch.bfloat16,
        "cuda",
    )
    g = torch.Generator().manual_seed(1)
    prompts = [
        torch.randint(100, 40000, (int(n),), generator=g).tolist()
        for n in torch.randint(20, 400, (8,), generator=g)
    ]

    def first_tokens(choice: str) -> tuple[list[int], LLMEngine]:
        engine = LLMEngine(
            "",
            EngineConfig(
                device="cuda",
                dtype="bfloat16",
                num_blocks=512,
                cuda_graphs=True,
                max_batch=16,
                max_context_tokens=1024,
                fused_kernels=True,
                prefill_attention=choice,
            ),
            model=model,
            tokenizer=NullTokenizer(model.cfg.vocab_size),
        )

        async def one(i, p):
            req = GenerationRequest(f"{choice}{i}", [], 1, ignore_eos=True, prompt_ids=p)
            return next(e.token_id async for e in engine.submit(req) if e.finish_reason is None)

        async def all_():
            return await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))

        try:
            assert model.prefill_attention == choice
            return asyncio.run(all_()), engine
        finally:
            engine.close()

    with_flash, engine = first_tokens("flash")
    with_sdpa, _ = first_tokens("sdpa")
    assert engine.core.runner.eager_steps["prefill"] == 0  # flash prefill replayed from graphs
    same = sum(a == b for a, b in zip(with_flash, with_sdpa))
    print(f"first tokens after prefill, flash against sdpa (bf16): {same} of {len(prompts)}")
    assert same >= len(prompts) - 1
