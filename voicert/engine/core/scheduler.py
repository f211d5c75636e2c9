"""Continuous batching: which sequences run in the next forward, and what their results mean.

Plain Python over token ids and block ids (no torch), unit-tested on the CPU. Each engine step is
either a *prefill* step (prompt chunks of newly admitted sequences, padded cost within
``prefill_token_budget``) or a *decode* step (every running sequence, one token plus any speculative
drafts). When both are pending they alternate, so a long prompt never holds others' decoding back by
more than one budget-sized chunk.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from voicert.engine.core.kv_cache import BlockManager, OutOfBlocks
from voicert.engine.core.sequence import Sequence, Status
from voicert.engine.core.spec_policy import SpecPolicy
from voicert.engine.core.speculative import accept_greedy, ngram_propose


@dataclass(slots=True)
class SchedulerConfig:
    max_batch: int = 64  # sequences decoding together
    prefill_token_budget: int = 512  # padded prompt tokens per prefill step
    spec_tokens: int = 0  # drafts per decode step (0: plain greedy)
    external_drafts: bool = False  # drafts come from a draft model after scheduling, not n-grams
    head_drafts: bool = False  # drafts are the draft heads' guesses from the sequence's last step
    # The shapes a prefill step is padded to (the runner's captured graphs; empty: exact shapes).
    # With them a step's padded cost is bucket(rows) * bucket(width), kept within the budget.
    prefill_batches: tuple[int, ...] = ()
    prefill_widths: tuple[int, ...] = ()
    # prefill steps in a row a prompt longer than one step may yield to prompts that fit in one
    # (0: first come, first served; docs/benchmarks.md 38)
    long_prompt_skips: int = 2
    # tokens of a chunk of such a prompt while other sequences run (0: the whole budget)
    long_prompt_chunk: int = 0

    def __post_init__(self) -> None:
        if self.max_batch < 1 or self.prefill_token_budget < 1 or self.spec_tokens < 0:
            raise ValueError("scheduler limits must be positive")


@dataclass(slots=True)
class Chunk:
    seq: Sequence
    start: int  # compute tokens[start:end] this step
    end: int

    @property
    def samples(self) -> bool:
        """The chunk finishes the sequence's pending tokens, so its last logits give a token."""
        return self.end == len(self.seq.tokens)


@dataclass(slots=True)
class Step:
    kind: str  # "prefill" | "decode"
    chunks: list[Chunk] = field(default_factory=list)  # prefill
    seqs: list[Sequence] = field(default_factory=list)  # decode; each seq.draft is set
    drafts: int = 0  # decode: the drafts per row it was planned with (rows near their end: fewer)
    emitted: int = 0  # decode: tokens its live rows gained (set by Scheduler.postprocess)
    live: int = 0  # decode: its rows still decoding when it was postprocessed

    @property
    def guided(self) -> bool:
        """A row of the step decodes under a grammar."""
        return any(c.seq.guide is not None for c in self.chunks) or any(
            s.guide is not None for s in self.seqs
        )

    @property
    def host_picks(self) -> bool:
        """A row's token is picked on the host after the step (a grammar, or sampling)."""
        return any(c.seq.host_picks for c in self.chunks) or any(s.host_picks for s in self.seqs)

    @property
    def scoring(self) -> list[int]:
        """Rows whose prompt ends in this step and that ask for a probability (score_end)."""
        return [i for i, c in enumerate(self.chunks) if c.samples and c.seq.scores]

    @property
    def reads_logits(self) -> bool:
        """The step's logits are read after it (a guided, sampled or scoring row): the runner
        keeps them readable."""
        return self.host_picks or bool(self.scoring)


@dataclass(slots=True)
class SpecStats:
    seq_steps: int = 0  # (sequence, decode step) pairs
    proposed: int = 0
    accepted: int = 0
    emitted: int = 0  # tokens produced by decode steps (accepted drafts + target tokens)

    @property
    def acceptance_rate(self) -> float:
        """Accepted drafts / proposed drafts."""
        return self.accepted / self.proposed if self.proposed else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Tokens a sequence gains per decode step (1.0 without speculation)."""
        return self.emitted / self.seq_steps if self.seq_steps else 0.0


def bucket(value: int, ladder: tuple[int, ...] | list[int]) -> int | None:
    """The smallest entry of a sorted ladder >= value (None if above it); ``value`` itself for an
    empty ladder (exact shapes)."""
    if not ladder:
        return value
    return next((x for x in ladder if x >= value), None)


class Scheduler:
    def __init__(
        self,
        blocks: BlockManager,
        cfg: SchedulerConfig,
        stop_ids: set[int],
        policy: SpecPolicy | None = None,
    ) -> None:
        """``policy`` decides, per decode step, whether it carries drafts (default: every step
        with ``spec_tokens`` > 0 does)."""
        self.blocks = blocks
        self.cfg = cfg
        self.stop_ids = stop_ids
        self.policy = policy
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.spec = SpecStats()
        self._last_prefill = False
        self.preemptions = 0

    # ---------------------------------------------------------------- requests

    def add(self, seq: Sequence) -> None:
        seq.status = Status.WAITING
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def cancel(self, request_id: str) -> Sequence | None:
        """Remove a request wherever it is and free its blocks. Returns it, or None if unknown."""
        for seq in self.waiting:
            if seq.id == request_id:
                self.waiting.remove(seq)
                return self._finish(seq, "cancelled")
        for seq in self.running:
            if seq.id == request_id:
                return self._finish(seq, "cancelled")
        return None

    def finish(self, seq: Sequence, reason: str) -> None:
        """End a running sequence that is complete for a reason the scheduler cannot see (its
        grammar allows nothing more); its blocks are freed."""
        if seq.status is not Status.FINISHED:
            self._finish(seq, reason)

    def _finish(self, seq: Sequence, reason: str) -> Sequence:
        seq.status = Status.FINISHED
        seq.finish_reason = reason
        if seq in self.running:
            self.running.remove(seq)
        if seq.blocks is not None:
            self.blocks.free_seq(seq.blocks)
            seq.blocks = None
        return seq

    # ---------------------------------------------------------------- scheduling

    def _admit(self) -> list[Sequence]:
        """Give waiting sequences their blocks (prefix-cache hits included). Returns any that can
        never fit and were finished with an error."""
        failed = []
        while self.waiting and len(self.running) < self.cfg.max_batch:
            seq = self.waiting[0]
            try:
                seq.blocks, cached = self.blocks.allocate(seq.tokens, reserve=1)
            except OutOfBlocks:
                if not self.running:  # nothing will ever free up: it cannot fit at all
                    self.waiting.popleft()
                    failed.append(self._finish(seq, "error"))
                    continue
                break
            self.waiting.popleft()
            seq.num_computed = cached
            if not seq.prefill_start_ns:
                seq.cached_tokens = cached
            seq.status = Status.PREFILL
            self.running.append(seq)
        return failed

    def schedule(self) -> tuple[Step | None, list[Sequence]]:
        """The next step (None if idle) and sequences that failed admission."""
        failed = self._admit()
        prefills = [s for s in self.running if s.status is Status.PREFILL]
        decodes = [s for s in self.running if s.status is Status.DECODE]
        if prefills and not (decodes and self._last_prefill):
            self._last_prefill = True
            return self._prefill_step(prefills), failed
        self._last_prefill = False
        if decodes:
            return self._decode_step(decodes), failed
        return None, failed

    def _prefill_step(self, seqs: list[Sequence]) -> Step:
        """The oldest pending prompt first (a budget-sized chunk of it), then whole prompts of
        others, while the padded step (rows x its widest row) stays within the budget: a reply's
        prompt goes in the same step as its slightly shorter end-of-turn score.

        A prompt longer than one step does not hold the others back: while prompts that fit in
        a step wait behind it, the oldest of those leads instead (it is done in this step, its
        first token comes now, not after every chunk of the long one). The long prompt is passed
        over at most ``long_prompt_skips`` steps in a row, so it still moves under a steady flow
        of short ones: at least one chunk in every ``long_prompt_skips + 1`` prefill steps."""
        budget = self.cfg.prefill_token_budget
        seqs = self._fair_order(seqs, budget)
        chunks: list[Chunk] = []
        width = 0
        for seq in seqs:
            todo = len(seq.tokens) - seq.num_computed
            if not chunks:
                n = min(todo, self._chunk_limit(todo, budget))
                width = bucket(n, self.cfg.prefill_widths) or n
            else:
                n = todo  # later rows come whole; one may widen the step while it stays in budget
                wide = max(width, bucket(n, self.cfg.prefill_widths) or n)
                rows = bucket(len(chunks) + 1, self.cfg.prefill_batches)
                if rows is None or rows * wide > budget:
                    continue
                width = wide
            chunks.append(Chunk(seq, seq.num_computed, seq.num_computed + n))
        return Step("prefill", chunks=chunks)

    def _chunk_limit(self, todo: int, budget: int) -> int:
        """The most tokens of a pending prompt one step computes: the budget, or for a prompt
        longer than that while other sequences run, ``long_prompt_chunk`` (a caller's next token
        then waits for a short chunk, not a budget-sized one)."""
        cap = self.cfg.long_prompt_chunk
        busy = len(self.running) + len(self.waiting) > 1
        return min(cap, budget) if cap and todo > budget and busy else budget

    def _fair_order(self, seqs: list[Sequence], budget: int) -> list[Sequence]:
        """``seqs`` (oldest first), with the oldest short prompt moved to the front when the
        oldest is a long one (more than ``budget`` tokens to go) that may be passed over."""
        head = seqs[0]
        if (
            len(head.tokens) - head.num_computed <= budget
            or head.prefill_skips >= self.cfg.long_prompt_skips
        ):
            head.prefill_skips = 0
            return seqs
        short = next((s for s in seqs if len(s.tokens) - s.num_computed <= budget), None)
        if short is None:
            return seqs
        head.prefill_skips += 1
        return [short, *(s for s in seqs if s is not short)]

    def drafts_for(self, batch: int) -> int:
        """Drafts per row for a decode step of ``batch`` rows (the policy's choice, told whether
        a prompt waits for its prefill)."""
        if self.policy is None:
            return self.cfg.spec_tokens
        return min(self.policy.drafts(batch, self.prompts_pending()), self.cfg.spec_tokens)

    def prompts_pending(self) -> bool:
        """Whether a prompt waits for admission or for the rest of its prefill."""
        return bool(self.waiting) or any(s.status is Status.PREFILL for s in self.running)

    def observe(self, step: Step, seconds: float) -> None:
        """A decode step's measured duration, for the speculation policy."""
        if self.policy is not None and step.kind == "decode" and step.seqs:
            self.policy.observe(len(step.seqs), step.drafts, seconds, step.live, step.emitted)

    def _decode_step(self, seqs: list[Sequence]) -> Step:
        picked: list[Sequence] = []
        planned = self.drafts_for(min(len(seqs), self.cfg.max_batch))
        for seq in seqs[: self.cfg.max_batch]:
            if seq.status is not Status.DECODE:
                continue  # preempted earlier in this loop
            k = max(min(planned, seq.remaining - 1), 0)
            if not seq.speculates:
                k = 0  # picked under a grammar's mask, one token at a time
            if self.cfg.external_drafts:
                seq.draft = []  # the draft model fills it after scheduling; reserve its k slots
                need = len(seq.tokens) + k
            else:
                if k <= 0:
                    seq.draft = []
                elif self.cfg.head_drafts:
                    seq.draft = seq.head_draft[:k]
                else:
                    seq.draft = ngram_propose(seq.tokens, k)
                need = len(seq.tokens) + len(seq.draft)
            while not self.blocks.can_grow(seq.kv, need) and seq.draft:
                seq.draft = []  # drop the drafts before anybody else's KV
                need = len(seq.tokens)
            while not self.blocks.can_grow(seq.kv, need):
                if not self._preempt_one(keep={id(s) for s in picked} | {id(seq)}):
                    break
            if not self.blocks.can_grow(seq.kv, need):
                self._preempt_one(keep=set(), victim=seq)  # alone it still does not fit: requeue
                continue
            self.blocks.grow(seq.kv, need)
            picked.append(seq)
        # rotate so sequences beyond max_batch get their turn next time
        if len(seqs) > self.cfg.max_batch:
            for seq in picked:
                self.running.remove(seq)
                self.running.append(seq)
        return Step("decode", seqs=picked, drafts=planned)

    def plan_ahead(self, step: Step) -> Step | None:
        """The decode step after ``step``, to launch before ``step``'s tokens are known (the
        runner feeds its inputs on the GPU from ``step``'s results), so the host's work on one
        step overlaps the GPU's on the next. Given only while nothing else could want that step
        and its shape is known: plain greedy decoding, or speculation with draft heads where
        every row carries all the drafts ``step`` was planned with (the heads' guesses come out of
        the step itself; n-gram and draft-model drafts need the tokens first) and the policy
        wants the same for the next step (the step ahead has ``step``'s width); every running
        sequence in ``step``; none waiting; none close enough to its length limit that the next
        step would carry fewer drafts. Grows each sequence's blocks by the slots the step may
        write (the most drafts accepted); None (and nothing changed) otherwise. Call
        :meth:`bind_ahead` once ``step`` is postprocessed. A sequence that stops or is cancelled
        meanwhile has its row ignored by :meth:`postprocess`."""
        k = step.drafts
        if (
            step.kind != "decode"
            or self.waiting
            or (k and not self.cfg.head_drafts)
            or step.host_picks
        ):
            return None  # (a row's token may be replaced after the step: fed would be wrong)
        if self.drafts_for(len(step.seqs)) != k:
            return None
        if len(self.running) != len(step.seqs) or any(
            len(s.draft) != k or s.remaining < 2 * k + 2 or s.status is not Status.DECODE
            for s in step.seqs
        ):
            return None
        need = sum(
            self.blocks.blocks_for(len(s.tokens) + 2 * k + 1) - len(s.kv.table) for s in step.seqs
        )
        if need > self.blocks.available:
            return None
        for s in step.seqs:
            self.blocks.grow(s.kv, len(s.tokens) + 2 * k + 1)
        return Step("decode", seqs=list(step.seqs), drafts=k)

    def bind_ahead(self, step: Step) -> None:
        """Give a step planned ahead the drafts it was launched with, now that the step before
        it is postprocessed: each row's heads' guesses after its last token, as
        :meth:`_decode_step` would have taken them."""
        k = step.drafts
        for s in step.seqs:
            if s.status is Status.DECODE:
                s.draft = s.head_draft[:k] if k else []

    def _preempt_one(self, keep: set[int], victim: Sequence | None = None) -> bool:
        """Free ``victim`` or else the most recently admitted sequence not in ``keep`` (ids); it
        goes back to the front of the queue and recomputes (mostly from the prefix cache) when
        blocks free up."""
        if victim is None:
            victim = next((s for s in reversed(self.running) if id(s) not in keep), None)
            if victim is None:
                return False
        self.running.remove(victim)
        self.blocks.free_seq(victim.kv)
        victim.blocks = None
        victim.num_computed = 0
        victim.draft = []
        victim.status = Status.WAITING
        self.waiting.appendleft(victim)
        self.preemptions += 1
        return True

    # ---------------------------------------------------------------- results

    def postprocess(
        self, step: Step, sampled: list[list[int]], drafts: list[list[list[int]]] | None = None
    ) -> list[tuple[Sequence, list[int]]]:
        """Apply one step's argmax tokens (one list per row: prefill rows that sample give one
        token; decode rows give len(draft) + 1) and, with draft heads, their guesses at each of
        those positions. Returns (sequence, tokens to emit) for every row that produced tokens;
        finished sequences have ``finish_reason`` set and blocks freed."""
        out: list[tuple[Sequence, list[int]]] = []
        if step.kind == "prefill":
            for i, (chunk, toks) in enumerate(zip(step.chunks, sampled)):
                seq = chunk.seq
                seq.num_computed = chunk.end
                self.blocks.register_full(seq.kv, seq.tokens, seq.num_computed)
                if chunk.samples:
                    seq.status = Status.DECODE
                    if drafts is not None:
                        seq.head_draft = drafts[i][0]
                    out.append((seq, self._append(seq, toks[:1])))
            return out
        for i, (seq, toks) in enumerate(zip(step.seqs, sampled)):
            if seq.status is not Status.DECODE:
                continue  # stopped or cancelled after the step was launched
            self.spec.seq_steps += 1
            new = accept_greedy(seq.draft, toks) if seq.draft else toks[:1]
            if drafts is not None:  # the guesses made where the last emitted token was sampled
                seq.head_draft = drafts[i][len(new) - 1]
            self.spec.proposed += len(seq.draft)
            self.spec.accepted += len(new) - 1
            self.spec.emitted += len(new)
            step.emitted += len(new)
            step.live += 1
            seq.num_computed = len(seq.tokens) + len(new) - 1
            seq.draft = []
            out.append((seq, self._append(seq, new)))
        return out

    def _append(self, seq: Sequence, new: list[int]) -> list[int]:
        """Append tokens up to a stop token or the length limit; finish the sequence if reached."""
        kept: list[int] = []
        reason = None
        stops = () if seq.request.ignore_eos else self.stop_ids
        for tok in new:
            if tok in stops:
                reason = "stop"
                break
            kept.append(tok)
            if seq.num_generated + len(kept) >= seq.request.max_new_tokens:
                reason = "length"
                break
        seq.tokens += kept
        if reason is None:
            self.blocks.register_full(seq.kv, seq.tokens, seq.num_computed)
        else:
            self._finish(seq, reason)
        return kept
