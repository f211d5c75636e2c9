"""Sampled decoding in the engine core: the distribution a token is drawn from equals its reference
(temperature, top-k, nucleus), a draw equals torch's multinomial over its support with the same
seed, a seeded request repeats itself, greedy rows beside sampled ones are untouched, a sampled
row's first tokens follow the model's distribution, speculation keeps a sampled reply's
distribution (rejection sampling over the drafts), and a sampled tool call still validates
against its schema. A random SmolLM2-shaped model (2 layers): its distributions are wide, so
draws differ where they should."""

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


def test_a_draw_is_torch_multinomial_over_the_support_with_the_requests_seed():
    logits = torch.randn(1000, generator=torch.Generator().manual_seed(5))
    s = Sampling(0.9, 0.95, 0, seed=42)
    sampler = Sampler(s)
    gen = torch.Generator().manual_seed(42)
    probs = filtered_probs(logits, s)
    support = probs.nonzero().squeeze(1)  # the nucleus: fewer than the 1000
    assert 0 < support.numel() < 1000
    for _ in range(20):
        want = support[torch.multinomial(probs[support], 1, generator=gen)]
        assert sampler.draw(logits) == int(want.item())
    full = Sampler(Sampling(0.9, seed=42))  # no filter: every token is in the support
    gen.manual_seed(42)
    probs = filtered_probs(logits, Sampling(0.9))
    assert full.draw(logits) == int(torch.multinomial(probs, 1, generator=gen).item())
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


def _tv(a: np.ndarray, b: np.ndarray) -> float:
    return float(0.5 * np.abs(a - b).sum())


def _close(draws: list[int], p: np.ndarray) -> bool:
    """``draws`` look like samples of ``p``: their total variation from it is under 3x what
    sampling noise alone gives on average (sum of sqrt(2 p (1 - p) / (pi n)) over 2)."""
    n = len(draws)
    noise = 0.5 * float(np.sqrt(2 * p * (1 - p) / (np.pi * n)).sum())
    return _tv(np.bincount(draws, minlength=p.size) / n, p) < 3 * noise


@pytest.mark.parametrize("draft_p", [0.05, 0.4, 0.9])
def test_verifying_a_draft_emits_the_target_distribution(draft_p):
    """4000 seeded verifications of a two-token draft over 8 tokens: the first emitted token is
    distributed as p_0 (kept or drawn from the rest), the second (where the first draft was kept)
    as p_1, and the bonus token as p_2 (:func:`_close`: within 3x the noise, 0.015 for the first
    at n = 4000). A sampler that kept every draft, or drew a refusal from p_0 itself, is off by
    0.1-0.9."""
    v, draft = 8, [3, 5]
    logits = torch.randn(3, v, generator=torch.Generator().manual_seed(11))
    logits[0, 3] = 0.0
    rest = torch.cat([logits[0, :3], logits[0, 4:]])
    logits[0, 3] = float(np.log(draft_p / (1 - draft_p)) + torch.logsumexp(rest, 0))  # p_0(3)
    sampling = Sampling(1.0)
    p = [filtered_probs(logits[j], sampling).numpy() for j in range(3)]
    assert abs(p[0][3] - draft_p) < 1e-5
    first, second, third = [], [], []
    for seed in range(4000):
        out = Sampler(dataclasses.replace(sampling, seed=seed)).verify(draft, logits)
        assert 1 <= len(out) <= 3 and out[: len(out) - 1] == draft[: len(out) - 1]
        first.append(out[0])
        if out[0] == draft[0]:
            second.append(out[1])
            if out[1] == draft[1]:
                third.append(out[2])
    assert _close(first, p[0]) and _close(second, p[1])
    if len(third) >= 100:
        assert _close(third, p[2])


def test_a_certain_draft_is_always_kept():
    logits = torch.full((2, 6), -1e9)
    logits[0, 2] = 0.0  # p_0(2) == 1
    logits[1] = torch.arange(6.0)
    for seed in range(50):
        out = Sampler(Sampling(1.0, seed=seed)).verify([2], logits)
        assert out[0] == 2 and len(out) == 2


def _replies(core, n: int = 300) -> list[list[int]]:
    """``n`` seeded 6-token replies, top-3, to a prompt that repeats itself, 25 at a time (drafts
    are planned once no prompt waits): the replies repeat themselves too, so n-gram drafts are
    proposed, and kept or refused."""
    text, out = "one two three one two three one two three one two", []
    for batch in range(0, n, 25):
        reqs = [
            _ask(f"r{i}", Sampling(1.0, top_k=3, seed=i), n=6, text=text)
            for i in range(batch, batch + 25)
        ]
        out += [ids for ids, _ in _run(core, *reqs).values()]
    return out


def _differ(a: list[list[int]], b: list[list[int]]) -> list[str]:
    """Where two samples of replies differ by more than 3x sampling noise: each position's
    token, and how often a token repeats the one before (what keeping drafts too often raises)."""
    bad = []
    for j in range(6):
        keys = sorted({r[j] for r in a} | {r[j] for r in b})
        pa = np.array([sum(r[j] == k for r in a) for k in keys]) / len(a)
        pb = np.array([sum(r[j] == k for r in b) for k in keys]) / len(b)
        pool = (pa + pb) / 2
        noise = 0.5 * float(np.sqrt(4 * pool * (1 - pool) / (np.pi * len(a))).sum())
        if _tv(pa, pb) > 3 * noise:
            bad.append(f"position {j}: {_tv(pa, pb):.3f} > 3 x {noise:.3f}")
    ra, rb = (np.mean([r[j] == r[j - 1] for r in x for j in range(1, 6)]) for x in (a, b))
    se = float(np.sqrt(2 * (ra + rb) / 2 * (1 - (ra + rb) / 2) / (5 * len(a))))
    if abs(ra - rb) > 3.5 * se:
        bad.append(f"repeats: {ra:.3f} against {rb:.3f} (se {se:.3f})")
    return bad


def test_speculation_keeps_a_sampled_replys_distribution(monkeypatch):
    """300 seeded replies with n-gram speculation and 300 without: each position's token, and
    the share of tokens that repeat the one before, agree within 3x sampling noise (seeds fixed:
    no flakes). The check has teeth: a verifier that keeps every draft fails it (repeats 0.647
    against 0.551, 5.3 standard errors where 3.5 fails)."""
    plain = _replies(_core())
    spec = _core(spec_tokens=3, spec_policy="always")
    assert _differ(_replies(spec), plain) == []
    stats = spec.scheduler.spec
    assert 0 < stats.accepted < stats.proposed  # drafts were kept, and refused

    def keep_all(self, draft, logits):
        return [*draft, self.draw(logits[len(draft)])]

    monkeypatch.setattr(Sampler, "verify", keep_all)
    assert _differ(_replies(_core(spec_tokens=3, spec_policy="always")), plain) != []


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


@pytest.mark.parametrize(
    "sampling",
    [
        Sampling(temperature=5e-324),
        Sampling(temperature=1e-40),
        Sampling(temperature=1.0, top_p=1e-300),
        Sampling(temperature=5e-324, top_p=1e-300, top_k=3),
    ],
)
def test_extreme_but_valid_parameters_give_the_greedy_distribution_not_nans(sampling):
    """A temperature or top_p near zero is greedy in the limit; computed naively it overflowed
    to inf and NaN and failed the whole shared engine step (every caller's reply in it)."""
    logits = torch.tensor([1.0, 3.5, -2.0, 3.25, float("-inf")])
    probs = filtered_probs(logits, sampling)
    assert torch.equal(probs, torch.tensor([0.0, 1.0, 0.0, 0.0, 0.0]))
    allowed = torch.tensor([True, False, True, True, False])
    assert filtered_probs(logits, sampling, allowed).argmax().item() == 3
    assert Sampler(sampling).draw(logits) == 1


def test_a_draw_that_fails_ends_its_own_reply_and_no_other(core, monkeypatch):
    """A sampled row's draw is host work after the shared step: when it fails (the sampler
    raises), that request ends with an error and the step's other rows go on as they would."""
    alone = _run(core, _ask("g", Sampling()), _ask("s", Sampling(1.0, seed=3)))
    draw = Sampler.draw

    def broken(self, logits, allowed=None):
        if self.sampling.seed == 66:
            raise RuntimeError("probability tensor contains either inf, nan or element < 0")
        return draw(self, logits, allowed)

    monkeypatch.setattr(Sampler, "draw", broken)
    together = _run(
        core,
        _ask("g", Sampling()),
        _ask("bad", Sampling(1.0, seed=66)),
        _ask("s", Sampling(1.0, seed=3)),
    )
    assert together["g"] == alone["g"] and together["s"] == alone["s"]
    assert together["bad"] == ([], "error")
