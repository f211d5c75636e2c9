"""End-of-turn scores from the engine (``score_end`` requests): the model's probability of its
end-of-message token after the user's words so far, on the embedded model's real weights."""

import pytest
import torch

from voicert.core.chat import ChatMessage
from voicert.core.llm import FinishReason, GenerationRequest, request_problem
from voicert.engine.build import EngineConfig, build_core
from voicert.engine.core.engine_core import EngineCore

SYSTEM = ChatMessage("system", "You are a helpful voice assistant.")


@pytest.fixture(scope="module")
def model_dir():
    from voicert.config import cache_dir, load_config
    from voicert.engine.loader import resolve_llm

    return str(resolve_llm("embedded", cache_dir(load_config(environ={}).models)))


@pytest.fixture(scope="module")
def core(model_dir) -> EngineCore:
    return build_core(model_dir, EngineConfig(num_blocks=128, torchscript=False))


def _score(rid: str, text: str) -> GenerationRequest:
    return GenerationRequest(rid, [SYSTEM, ChatMessage("user", text)], 1, score_end=True)


def _scores(core: EngineCore, requests: list[GenerationRequest]) -> dict[str, float | None]:
    for r in requests:
        core.add(r)
    outs = []
    while core.has_work():
        outs.extend(core.step())
    ids = {r.request_id for r in requests}
    mine = [o for o in outs if o.request_id in ids]
    assert all(o.finish_reason == FinishReason.STOP and o.token_id == -1 for o in mine)
    assert len(mine) == len(ids)  # one final record each: a score generates no token
    return {o.request_id: o.end_prob for o in mine}


def _reference(model_dir: str, text: str) -> float:
    """transformers on the same weights: P(<|im_end|>) after the templated, still-open turn."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    msgs = [{"role": "system", "content": SYSTEM.content}, {"role": "user", "content": text}]
    rendered = tok.apply_chat_template(msgs, tokenize=False)
    open_turn = rendered[: rendered.rindex("<|im_end|>")]
    ids = tok(open_turn, return_tensors="pt").input_ids
    with torch.no_grad():
        probs = model(ids).logits[0, -1].float().softmax(-1)
    return probs[tok.convert_tokens_to_ids("<|im_end|>")].item()


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
    alone = _scores(core, [_score("alone", text)])["alone"]
    cached = _scores(core, [_score("cached", text)])["cached"]  # its prefix is in the pool now
    core.add(GenerationRequest("gen", [ChatMessage("user", "Tell me a story")], 6, ignore_eos=True))
    batched = _scores(core, [_score("batched", text), _score("other", "Yes please.")])["batched"]
    assert cached == pytest.approx(alone, rel=1e-4) and batched == pytest.approx(alone, rel=1e-4)
    assert not core.has_work() and not core.scheduler.running


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


async def test_an_engine_that_cannot_score_fails_the_request_and_says_so():
    from voicert.config import LlmConfig
    from voicert.engine.clients.openai_compat import OpenAICompatEngine

    engine = OpenAICompatEngine(LlmConfig(), "some-model")
    assert not engine.scores
    events = [e async for e in engine.submit(_score("r", "Yes please."))]
    assert events[-1].finish_reason == FinishReason.ERROR
    assert "cannot score" in (events[-1].error or "")
