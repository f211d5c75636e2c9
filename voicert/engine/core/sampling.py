"""Sampled decoding: a request with a temperature above 0 draws each token from the model's
distribution, reshaped as the OpenAI API defines it (``temperature``, then ``top_k``, then
``top_p``, the nucleus), with a generator of its own (``seed``: the same seed, prompt and engine
give the same reply). Greedy stays the default, and voice turns use it.

A sampled row is picked on the host after its step, from its logits, as a grammar-guided row is
(engine_core.py): the step's greedy token is replaced. Under a grammar (tools), the draw is over the
tokens the grammar allows, one token a step.

A sampled row without a grammar speculates as a greedy one does: its drafts (n-gram, draft heads,
a draft model; each a deterministic function of the tokens so far) are verified in one step and
kept by rejection sampling (:meth:`Sampler.verify`), so the reply is drawn from exactly the
distribution plain sampling draws from.
"""

from __future__ import annotations

import os

import torch

from voicert.core.llm import Sampling

TINY = torch.finfo(torch.float32).tiny  # the smallest normal float32


def filtered_probs(
    logits: torch.Tensor, sampling: Sampling, allowed: torch.Tensor | None = None
) -> torch.Tensor:
    """The distribution a token is drawn from: logits [V] (any float dtype, any device) ->
    probabilities [V] float32: the tokens ``allowed`` (bool [V]) only, softmax at
    ``temperature``, the ``top_k`` most likely kept (0: all), then the smallest set whose
    probability reaches ``top_p`` (1: all), renormalised. Any temperature in (0, 2] and top_p in
    (0, 1] gives a distribution: the logits are shifted to a maximum of 0 before the division (a
    temperature of 5e-324 sends the rest to -inf, never the best to +inf: greedy, its limit),
    and the nucleus always keeps the most likely token (a top_p below float32's smallest
    number is 0 there)."""
    x = logits.float()  # [V]
    if allowed is not None:
        x = x.masked_fill(~allowed, float("-inf"))
    # below float32's smallest normal a temperature is 0 there, and 0 / 0 is NaN: the division
    # at that temperature already leaves only the best (and any tied with it)
    x = (x - x.max()) / max(sampling.temperature, TINY)  # [V], <= 0
    if 0 < sampling.top_k < x.numel():
        kth = torch.topk(x, sampling.top_k).values[-1]
        x = x.masked_fill(x < kth, float("-inf"))
    probs = torch.softmax(x, -1)  # [V]
    if sampling.top_p < 1.0:
        sorted_p, order = torch.sort(probs, descending=True)  # [V] each
        before = torch.cumsum(sorted_p, -1) - sorted_p  # [V]: mass of the tokens ahead of each
        drop = before >= sampling.top_p  # the nucleus: each token kept until the mass is reached
        drop[0] = False  # and the most likely, whatever top_p rounds to in float32
        sorted_p = sorted_p.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter(0, order, sorted_p)
        probs = probs / probs.sum()
    return probs


class Sampler:
    """One request's draws. Not thread-safe: the engine thread owns it."""

    def __init__(self, sampling: Sampling, device: torch.device | str = "cpu") -> None:
        self.sampling = sampling
        seed = (
            sampling.seed if sampling.seed is not None else int.from_bytes(os.urandom(8), "little")
        )
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(seed & (2**63 - 1))

    def draw(self, logits: torch.Tensor, allowed: torch.Tensor | None = None) -> int:
        """One token from logits [V] (on the generator's device), over ``allowed`` (bool [V])."""
        return self._pick(filtered_probs(logits, self.sampling, allowed))

    def _pick(self, probs: torch.Tensor) -> int:
        """One token drawn from probs [V], over its support only: top-k, top-p and grammars leave
        a few tokens of a vocabulary of ~10^5, and ``torch.multinomial`` costs the same for
        every entry, zero or not (one draw over 49152 entries with 3 nonzero took ~9x the time
        of one over those 3, on the CPU)."""
        support = probs.nonzero().squeeze(1)  # [S] token ids, ascending
        if support.numel() == probs.numel():
            return int(torch.multinomial(probs, 1, generator=self.generator).item())
        return int(support[torch.multinomial(probs[support], 1, generator=self.generator)].item())

    def verify(self, draft: list[int], logits: torch.Tensor) -> list[int]:
        """Speculative sampling over a deterministic draft (Leviathan et al. 2023, Chen et al.
        2023, with the draft's distribution a point mass): ``logits`` [len(draft) + 1, V] are the
        target's after the last token and after each draft token. Draft token d_j is kept with
        probability p_j(d_j); at the first refusal the next token is drawn from p_j with d_j
        taken out (renormalised), and verification stops; if every draft is kept, one more
        token is drawn from the last position. So each emitted token has exactly the
        distribution :meth:`draw` would give it after the tokens before it. Returns the tokens
        to emit (1 to len(draft) + 1)."""
        out: list[int] = []
        for j, d in enumerate(draft):
            probs = filtered_probs(logits[j], self.sampling)  # [V]
            u = torch.rand(1, generator=self.generator, device=self.generator.device)
            if bool(u < probs[d]):
                out.append(d)
                continue
            rest = probs.clone()
            rest[d] = 0.0
            if not bool(rest.sum() > 0):  # p_j(d_j) == 1 up to rounding: no other token exists
                out.append(d)
                continue
            out.append(self._pick(rest))
            return out
        out.append(self.draw(logits[len(draft)]))
        return out
