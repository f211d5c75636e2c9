"""End-of-turn scores from the engine (``score_end`` requests): the model's probability of its
end-of-message token after the user's words so far, and its trained end-of-turn head's
probability from the same hidden state, on the embedded model's real weights."""

import pytest
import torch

from voicert.core.chat import ChatMessage
from voicert.core.llm import FinishReason, GenerationRequest, request_problem
from voicert.engine.build import build_core
from voicert.engine.core.engine_core import EngineCore
from voicert.engine.settings import EngineConfig

SYSTEM = ChatMessage("system", "You are a helpful voice assistant.")


@pytest.fixture(scope="module")
def model_dir():
    from voicert.config import cache_dir, load_config
    from voicert.engine.loader import resolve_llm

    cfg = load_config()  # the embedded model; on the GPU machine, the one its environment names
    return str(resolve_llm(cfg.models.llm, cache_dir(cfg.models)))


@pytest.fixture(scope="module")
def core(model_dir) -> EngineCore:
    return build_core(model_dir, EngineConfig(num_blocks=128, torchscript=False))


def _score(rid: str, text: str) -> GenerationRequest:
    return GenerationRequest(rid, [SYSTEM, ChatMessage("user", text)], 1, score_end=True)


def _scores(core: EngineCore, requests: list[GenerationRequest]) -> dict[str, float | None]:
    return {rid: end for rid, (end, _) in _both(core, requests).items()}


def _both(core: EngineCore, requests: list[GenerationRequest]) -> dict[str, tuple]:
    """request id -> (end_prob, turn_prob)."""
    for r in requests:
        core.add(r)
    outs = []
    while core.has_work():
        outs.extend(core.step())
    ids = {r.request_id for r in requests}
    mine = [o for o in outs if o.request_id in ids]
    assert all(o.finish_reason == FinishReason.STOP and o.token_id == -1 for o in mine)
    assert len(mine) == len(ids)  # one final record each: a score generates no token
    return {o.request_id: (o.end_prob, o.turn_prob) for o in mine}


def _reference(model_dir: str, text: str) -> float:
    """transformers on the same weights: P(<|im_end|>) after the templated, still-open turn."""
    return _reference_both(model_dir, text)[0]


def _reference_both(model_dir: str, text: str) -> tuple[float, torch.Tensor]:
    """(P(<|im_end|>), the final normed hidden state [hidden]) from transformers."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    msgs = [{"role": "system", "content": SYSTEM.content}, {"role": "user", "content": text}]
    rendered = tok.apply_chat_template(msgs, tokenize=False)
    open_turn = rendered[: rendered.rindex("<|im_end|>")]
    ids = tok(open_turn, return_tensors="pt").input_ids
    with torch.no_grad():
        out = model(ids, output_hidden_states=True)
    probs = out.logits[0, -1].float().softmax(-1)
    return probs[tok.convert_tokens_to_ids("<|im_end|>")].item(), out.hidden_states[-1][0, -1]


def test_the_score_is_the_models_probability_of_ending_the_message_as_transformers_gives_it(
    core, model_dir
):
    texts = ["What is the capital of France?", "I would like to book a table for"]
    ours = _scores(core, [_score(str(i), t) for i, t in enumerate(texts)])
    for i, text in enumerate(texts):
        ref = _reference(model_dir, text)
        assert ours[str(i)] == pytest.approx(ref, rel=2e-3, abs=1e-7), text


def test_a_complete_question_scores_far_above_a_phrase_that_stops_mid_way(core):
    s = _scores(
        core, [_score("c", "What is the capital of France?"), _score("i", "Add eggs, milk,")]
    )
    assert s["c"] > 100 * s["i"]


def test_scores_are_the_same_batched_with_generation_cached_or_alone(core):
    text = "Can you tell me about the weather in Paris tomorrow?"
    alone = _both(core, [_score("alone", text)])["alone"]
    cached = _both(core, [_score("cached", text)])["cached"]  # its prefix is in the pool now
    core.add(GenerationRequest("gen", [ChatMessage("user", "Tell me a story")], 6, ignore_eos=True))
    batched = _both(core, [_score("batched", text), _score("other", "Yes please.")])["batched"]
    for i in range(2):  # end_prob, turn_prob
        assert cached[i] == pytest.approx(alone[i], rel=1e-4)
        assert batched[i] == pytest.approx(alone[i], rel=1e-4)
    assert not core.has_work() and not core.scheduler.running


def test_the_turn_head_reads_the_hidden_state_transformers_computes(core, model_dir):
    from voicert.engine.core.turn_head import EMBEDDED_TURN_HEAD, load_turn_head

    head = load_turn_head(EMBEDDED_TURN_HEAD, core.model.norm.weight)
    texts = ["What is the capital of France?", "I would like to book a table for"]
    ours = _both(core, [_score(str(i), t) for i, t in enumerate(texts)])
    for i, text in enumerate(texts):
        want = head.prob(_reference_both(model_dir, text)[1].unsqueeze(0))[0]
        assert ours[str(i)][1] == pytest.approx(want, abs=2e-3), text


def test_the_shipped_turn_head_tells_a_finished_request_from_one_cut_mid_phrase(core):
    done = ["What is the capital of France?", "Set an alarm for seven tomorrow.", "Yes please."]
    cut = ["I would like to book a table for", "My number is five five", "Can you tell me the"]
    probs = _both(core, [_score(t, t) for t in done + cut])
    assert min(probs[t][1] for t in done) > max(probs[t][1] for t in cut)


def test_a_turn_head_made_for_another_checkpoint_is_refused(tmp_path, core):
    from voicert.engine.core.turn_head import load_turn_head, save_turn_head

    norm = core.model.norm.weight.detach().float()
    path = tmp_path / "head.safetensors"
    save_turn_head(path, torch.ones_like(norm), 0.0, norm * 1.1, {})
    with pytest.raises(ValueError, match="another checkpoint"):
        load_turn_head(path, norm)
    save_turn_head(path, torch.ones(8), 0.0, torch.ones(8), {})
    with pytest.raises(ValueError, match="hidden size 8"):
        load_turn_head(path, norm)
    save_turn_head(path, torch.ones_like(norm), 0.5, norm, {})
    assert load_turn_head(path, norm).bias == 0.5


def test_a_missing_turn_head_file_is_a_config_error_naming_the_key(model_dir):
    from voicert.config import ConfigError

    with pytest.raises(ConfigError, match="llm.turn_head"):
        build_core(model_dir, EngineConfig(num_blocks=8, torchscript=False, turn_head="/no/x"))


def test_without_a_turn_head_the_score_carries_no_head_probability(model_dir):
    bare = build_core(model_dir, EngineConfig(num_blocks=32, torchscript=False, turn_head="none"))
    end, head = _both(bare, [_score("n", "Yes please.")])["n"]
    assert end is not None and head is None


@pytest.mark.parametrize(
    "change, problem",
    [
        (dict(max_new_tokens=4), "max_new_tokens 1"),
        (dict(prompt_ids=[1, 2]), "no prompt_ids"),
        (dict(messages=[ChatMessage("assistant", "Hi")]), "must be the user's"),
        (dict(score_end=1), "must be a boolean"),
    ],
)
def test_a_score_request_that_cannot_be_scored_is_refused_alone(change, problem):
    request = _score("x", "Hello")
    for key, value in change.items():
        setattr(request, key, value)
    assert problem in (request_problem(request) or "")


async def test_the_threaded_engine_hands_the_score_to_the_caller_in_the_final_event(
    core, model_dir
):
    from voicert.engine.clients.llm_engine import LLMEngine

    want = _scores(core, [_score("want", "Yes please.")])["want"]
    engine = LLMEngine(model_dir, EngineConfig(num_blocks=64, torchscript=False))
    try:
        assert engine.scores
        events = [e async for e in engine.submit(_score("r", "Yes please."))]
    finally:
        engine.close()
    assert len(events) == 1 and events[0].finish_reason == FinishReason.STOP
    assert events[0].end_prob == pytest.approx(want, rel=1e-4)
    assert events[0].turn_prob is not None


async def test_an_engine_that_cannot_score_fails_the_request_and_says_so():
    from voicert.config import LlmConfig
    from voicert.engine.clients.openai_compat import OpenAICompatEngine

    engine = OpenAICompatEngine(LlmConfig(), "some-model")
    assert not engine.scores
    events = [e async for e in engine.submit(_score("r", "Yes please."))]
    assert events[-1].finish_reason == FinishReason.ERROR
    assert "cannot score" in (events[-1].error or "")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_the_gpu_graph_replayed_scores_equal_the_cpu_ones(core, model_dir):
    """fp32 on the GPU, prefill through CUDA graphs: the scores and the head's read of the hidden
    state the graph kept equal the CPU's."""
    cfg = EngineConfig(device="cuda", dtype="float32", num_blocks=256, cuda_graphs=True)
    gpu = build_core(model_dir, cfg)
    texts = ["What is the capital of France?", "I would like to book a table for", "Yes."]
    want = _both(core, [_score(f"c{i}", t) for i, t in enumerate(texts)])
    got = _both(gpu, [_score(f"c{i}", t) for i, t in enumerate(texts)])
    for rid, (end, head) in want.items():
        assert got[rid][0] == pytest.approx(end, rel=2e-3, abs=1e-7)
        assert got[rid][1] == pytest.approx(head, abs=2e-3)
