import pytest
import torch
from safetensors.torch import save_file

from voicert.engine.core.heads import EMBEDDED_HEADS, DraftHeads, load_heads


def test_embedded_heads_load_for_the_embedded_model_shape():
    heads = load_heads(EMBEDDED_HEADS, 576, 49152, torch.float32, "cpu")
    assert heads.num_heads >= 1
    h = torch.randn(3, 576)
    out = heads(h)  # [heads, 3, 576]
    assert out.shape == (heads.num_heads, 3, 576) and out.dtype == torch.float32


def test_heads_for_another_model_are_refused(tmp_path):
    with pytest.raises(ValueError, match="hidden size 2048"):
        load_heads(EMBEDDED_HEADS, 2048, 49152, torch.float32, "cpu")
    with pytest.raises(ValueError, match="vocabulary"):
        load_heads(EMBEDDED_HEADS, 576, 128256, torch.float32, "cpu")
    other = DraftHeads(8, 2)
    path = tmp_path / "h.safetensors"
    save_file(other.state_dict(), str(path), metadata={"vocab_size": "100"})
    assert load_heads(path, 8, 100, torch.float32, "cpu").num_heads == 2


def test_heads_and_a_draft_model_are_exclusive_and_k_is_capped():
    from voicert.bench.shapes import NullTokenizer, shape_config
    from voicert.engine.clients.llm_engine import LLMEngine
    from voicert.engine.models.llama import LlamaConfig, random_llama
    from voicert.engine.settings import EngineConfig

    model = random_llama(LlamaConfig.from_hf(shape_config("smollm2-random")), torch.float32, "cpu")
    tok = NullTokenizer(model.cfg.vocab_size)
    with pytest.raises(ValueError, match="more than"):
        LLMEngine(
            "",
            EngineConfig(num_blocks=64, spec_tokens=9, draft_heads="embedded", torchscript=False),
            model=model,
            tokenizer=tok,
        )
    with pytest.raises(ValueError, match="alternatives"):
        LLMEngine(
            "",
            EngineConfig(
                num_blocks=64,
                spec_tokens=2,
                draft_heads="embedded",
                draft_model="x",
                torchscript=False,
            ),
            model=model,
            tokenizer=tok,
        )


def test_auto_heads_are_the_embedded_ones_where_they_fit_and_n_grams_elsewhere():
    from voicert.bench.shapes import NullTokenizer, shape_config
    from voicert.engine.clients.llm_engine import LLMEngine
    from voicert.engine.models.llama import LlamaConfig, random_llama
    from voicert.engine.settings import EngineConfig

    fits = random_llama(
        LlamaConfig.from_hf(dict(shape_config("smollm2-random"), num_hidden_layers=2)),
        torch.float32,
        "cpu",
    )
    other = random_llama(
        LlamaConfig.from_hf(
            dict(
                shape_config("smollm2-random"),
                num_hidden_layers=2,
                hidden_size=128,
                num_attention_heads=2,
                num_key_value_heads=1,
            )
        ),
        torch.float32,
        "cpu",
    )
    for model, has_heads in ((fits, True), (other, False)):
        eng = LLMEngine(
            "",
            EngineConfig(num_blocks=64, spec_tokens=2, draft_heads="auto", torchscript=False),
            model=model,
            tokenizer=NullTokenizer(model.cfg.vocab_size),
        )
        try:
            assert (eng.core.heads is not None) is has_heads
            assert eng.core.scheduler.cfg.head_drafts is has_heads
        finally:
            eng.close()
