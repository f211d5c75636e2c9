"""Sampled decoding in the engine core: the distribution a token is drawn from equals its reference
(temperature, top-k, nucleus), a draw equals torch's multinomial on it with the same seed, a
seeded request repeats itself, greedy rows beside sampled ones are untouched, a sampled row's first
tokens follow the model's distribution, speculation does not change a sampled reply, and a sampled
tool call still validates against its schema. A random SmolLM2-shaped model (2 layers): its
distributions are wide, so draws differ where they should."""

from __future__ import annotations

import dataclasses
import json

import jsonschema
import numpy as np
import pytest
import torch

from tests.engine.random_model import random_core
from tests.engine.test_guided import BOOK, REQUIRED, _calls, _run
from voicert.core.chat import ChatMessage
from voicert.core.llm import GenerationRequest, Sampling, request_problem
from voicert.engine.core.sampling import Sampler, filtered_probs


def _core(**cfg):
    return random_core(num_blocks=512, **cfg)


@pytest.fixture(scope="module")
def core():
    return _core()


def _reference(logits: np.ndarray, t: float, top_k: int, top_p: float) -> np.ndarray:
    """The OpenAI-style reshaping, written with numpy: temperature, top-k, then the nucleus."""
    x = logits.astype(np.float64) / t
    if 0 < top_k < x.size:
        x = np.where(x < np.sort(x)[-top_k], -np.inf, x)
    p = np.exp(x - x.max())
    p /= p.sum()
    if top_p < 1:
        order = np.argsort(-p, kind="stable")
        before = np.cumsum(p[order]) - p[order]
        keep = np.zeros_like(p, dtype=bool)
        keep[order[before < top_p]] = True
        p = np.where(keep, p, 0.0)
        p /= p.sum()
    return p


@pytest.mark.parametrize(
    "t, top_k, top_p", [(1.0, 0, 1.0), (0.7, 0, 1.0), (1.3, 50, 1.0), (0.8, 0, 0.9), (1.0, 20, 0.5)]
)
def test_the_distribution_equals_its_reference(t, top_k, top_p):
    logits = torch.randn(4096, generator=torch.Generator().manual_seed(3)) * 3
    ours = filtered_probs(logits, Sampling(t, top_p, top_k)).numpy()
    want = _reference(logits.numpy(), t, top_k, top_p)
    np.testing.assert_allclose(ours, want, atol=1e-6)
    assert (ours > 0).sum() == (want > 0).sum()


def test_a_draw_is_torch_multinomial_with_the_requests_seed():
    logits = torch.randn(1000, generator=torch.Generator().manual_seed(5))
    s = Sampling(0.9, 0.95, 0, seed=42)
    sampler = Sampler(s)
    gen = torch.Generator().manual_seed(42)
    probs = filtered_probs(logits, s)
    for _ in range(20):
        assert sampler.draw(logits) == int(torch.multinomial(probs, 1, generator=gen).item())
    allowed = torch.zeros(1000, dtype=torch.bool)
    allowed[[3, 17, 999]] = True
    assert {Sampler(s).draw(logits, allowed) for _ in range(30)} <= {3, 17, 999}


def test_out_of_range_sampling_is_a_bad_request():
    ask = [ChatMessage("user", "Hi")]
    for bad in (
        Sampling(-0.1),
        Sampling(2.5),
        Sampling(1, 0),
        Sampling(1, 1, -1),
        Sampling(1, seed=1.5),
    ):
        assert request_problem(GenerationRequest("r", ask, 4, sampling=bad)) is not None
    assert request_problem(GenerationRequest("r", ask, 4, sampling=Sampling(2, 1, 5, 9))) is None


def _ask(
    rid: str, sampling: Sampling, n: int = 12, text: str = "Tell me a story"
) -> GenerationRequest:
    return GenerationRequest(
        rid, [ChatMessage("user", text)], n, ignore_eos=True, sampling=sampling
    )


def test_a_seeded_request_repeats_itself_and_seeds_differ(core):
    a = _run(core, _ask("a", Sampling(1.0, seed=1)))["a"]
    again = _run(core, _ask("a", Sampling(1.0, seed=1)))["a"]
    other = _run(core, _ask("a", Sampling(1.0, seed=2)))["a"]
    assert a == again and a[0] != other[0]


def test_greedy_rows_beside_sampled_rows_are_unchanged(core):
    alone = _run(core, _ask("g", Sampling()))["g"]
    together = _run(
        core,
        _ask("g", Sampling()),
        _ask("s1", Sampling(1.0, seed=3)),
        _ask("s2", Sampling(0.5, seed=4)),
    )
    assert together["g"] == alone
    assert together["s1"] == _run(core, _ask("s1", Sampling(1.0, seed=3)))["s1"]  # batched == alone


def test_first_tokens_follow_the_models_distribution(core, monkeypatch):
    """400 seeded requests, batched, top-20: the first token's empirical distribution is within a
    small total-variation distance of the distribution the step's logits give (seeds fixed: no
    flakes), every draw is in its top 20, and the greedy token is its mode."""
    seen: list[torch.Tensor] = []
    draw = Sampler.draw

    def record(self, logits, allowed=None):
        seen.append(logits.detach().clone())
        return draw(self, logits, allowed)

    monkeypatch.setattr(Sampler, "draw", record)
    sampling, ask = Sampling(1.0, top_k=20), [ChatMessage("user", "Pick a word")]
    reqs = [
        GenerationRequest(f"r{i}", ask, 1, sampling=dataclasses.replace(sampling, seed=i))
        for i in range(400)
    ]
    firsts = [ids[0] for ids, _ in _run(core, *reqs).values()]
    greedy = _run(core, GenerationRequest("g", ask, 1))["g"][0][0]
    assert len(seen) == 400 and all(torch.allclose(x, seen[0], atol=1e-4) for x in seen)
    want = filtered_probs(seen[0], sampling).numpy()
    counts = np.bincount(firsts, minlength=want.size) / len(firsts)
    tv = 0.5 * np.abs(counts - want).sum()
    assert tv < 0.15, tv  # 400 draws over 20 tokens: sampling noise alone is ~0.08
    assert set(firsts) <= set(np.flatnonzero(want)) and greedy == int(np.argmax(want))


def test_speculation_does_not_change_a_sampled_reply():
    spec = _core(spec_tokens=4, spec_policy="always")
    plain = _core()
    for seed in (1, 2):
        ask = _ask("s", Sampling(1.0, seed=seed), n=16, text="Count: one two three four")
        assert _run(spec, ask) == _run(plain, ask)


def test_a_sampled_tool_call_validates_against_its_schema(core):
    for seed in range(3):
        req = GenerationRequest(
            "t",
            [ChatMessage("user", "Book me a table for four at half seven")],
            200,
            tools=(BOOK,),
            tool_choice=REQUIRED,
            parallel_tool_calls=False,
            sampling=Sampling(1.0, seed=seed),
        )
        ((ids, _end),) = _run(core, req).values()
        calls = _calls(core, ids)
        assert len(calls) == 1 and calls[0].name == "book_table"
        jsonschema.validate(json.loads(calls[0].arguments), BOOK.schema)
