"""One request's state inside the engine."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from voicert.core.llm import GenerationRequest
from voicert.engine.core.kv_cache import SeqBlocks

if TYPE_CHECKING:  # made by the engine core (guided.py, sampling.py: torch); held here only
    from voicert.engine.core.guided import Guide
    from voicert.engine.core.sampling import Sampler


class Status(enum.Enum):
    WAITING = "waiting"  # not yet admitted (or preempted): holds no KV blocks
    PREFILL = "prefill"  # admitted; prompt KV partly computed
    DECODE = "decode"  # prompt done; one token per step (or more with speculation)
    FINISHED = "finished"


@dataclass(slots=True, eq=False)
class Sequence:
    request: GenerationRequest
    prompt: list[int]
    tokens: list[int] = field(default_factory=list)  # prompt + generated
    num_computed: int = 0  # leading tokens whose KV is in the pool
    blocks: SeqBlocks | None = None
    status: Status = Status.WAITING
    finish_reason: str | None = None
    arrival_ns: int = 0
    prefill_start_ns: int = 0
    cached_tokens: int = 0  # prompt tokens served from the prefix cache at admission
    draft: list[int] = field(default_factory=list)  # speculative tokens for the next step
    head_draft: list[int] = field(default_factory=list)  # draft heads' guess after the last token
    guide: Guide | None = None  # decoding under a grammar (a tool call's schema)
    sampler: Sampler | None = None  # sampled decoding (a temperature above 0); None: greedy
    score_id: int = -1  # a score_end request: the token whose probability after the prompt it asks
    end_prob: float | None = None  # ... and that probability, once its prompt is in
    turn_prob: float | None = None  # ... and the end-of-turn head's, where the model has one
    error: str | None = None  # why it ended with an error, for its final record
    prefill_skips: int = 0  # prefill steps in a row this long prompt yielded to short ones

    def __post_init__(self) -> None:
        if not self.tokens:
            self.tokens = list(self.prompt)

    @property
    def kv(self) -> SeqBlocks:
        """Its KV blocks: an admitted sequence (prefill or decode) has them; asking a waiting
        one is a scheduler bug, said as such."""
        if self.blocks is None:
            raise RuntimeError(f"sequence {self.id} holds no KV blocks ({self.status.value})")
        return self.blocks

    @property
    def id(self) -> str:
        return self.request.request_id

    @property
    def host_picks(self) -> bool:
        """Its tokens are picked on the host after each step (under a grammar, or sampled), not
        taken from the step's greedy result: the step's logits are read."""
        return self.guide is not None or self.sampler is not None

    @property
    def speculates(self) -> bool:
        """It may carry drafts: greedy rows (kept by agreement) and sampled rows (kept by
        rejection sampling, sampling.Sampler.verify); not a row under a grammar, whose mask
        each token needs the token before."""
        return self.guide is None

    @property
    def scores(self) -> bool:
        """A score_end request: its prompt's last logits give a probability, not a token."""
        return self.score_id >= 0

    @property
    def num_generated(self) -> int:
        return len(self.tokens) - len(self.prompt)

    @property
    def remaining(self) -> int:
        return self.request.max_new_tokens - self.num_generated
