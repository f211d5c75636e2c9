"""The engine core: continuous batching over a paged, prefix-cached KV pool, greedy decoding with
optional speculation. Synchronous and single-threaded: no threads, no asyncio, no streams.

The caller (an :class:`~voicert.engine.clients.llm_engine.EngineThread`, in the server process or in the
engine process) owns the only thread that touches it: it ``add``s and ``abort``s requests and calls
``step`` while ``has_work``. Every call returns the :class:`~voicert.engine.base.TokenOut` records it
produced (token ids and timestamps, keyed by request id); turning ids into text is the client's job
(:class:`~voicert.engine.clients.detok.IncrementalDetokenizer`). One step is three calls: schedule, run,
postprocess. How a core is built from the ``llm`` settings is ``engine/build.py``'s.
"""

from __future__ import annotations

import collections
import logging
import time
from dataclasses import dataclass
from typing import Any

from voicert.core.chat import ChatMessage
from voicert.core.llm import BAD_REQUEST, EngineLoad, FinishReason, GenerationRequest, StepRecord
from voicert.engine.base import TokenOut
from voicert.engine.core.draft import DraftModelProposer
from voicert.engine.core.guided import Guide, GuideError, Guides, masked_argmax
from voicert.engine.core.heads import DraftHeads
from voicert.engine.core.kv_cache import BlockManager
from voicert.engine.core.prompt import PromptBuilder
from voicert.engine.core.runner import ModelRunner, Pending
from voicert.engine.core.sampling import Sampler
from voicert.engine.core.scheduler import Scheduler, Step
from voicert.engine.core.sequence import Sequence
from voicert.engine.core.tools import offered
from voicert.engine.core.turn_head import TurnHead
from voicert.engine.models.base import Model
from voicert.engine.settings import EngineConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class CoreParts:
    """What a core steps with, built by ``engine/build.py`` from the ``llm`` settings."""

    model: Model
    tokenizer: Any
    prompts: PromptBuilder
    guides: Guides
    blocks: BlockManager
    runner: ModelRunner
    scheduler: Scheduler
    stop_ids: set[int]
    heads: DraftHeads | None = None  # speculation by draft heads on the model's hidden state
    drafter: DraftModelProposer | None = None  # speculation by a draft model
    turn_head: TurnHead | None = None  # score_end requests: P(turn over) from the hidden state


class EngineCore:
    """Model, KV pool, scheduler and runner behind three calls. Contract: one thread only; ``add``
    a checked request (:func:`~voicert.core.llm.request_problem`), ``abort`` any id at any time,
    ``step`` while ``has_work()``. A request's records end with one whose ``finish_reason`` is set;
    after that the core holds nothing of it. ``add`` raises for a request it cannot serve (the
    prompt cannot be templated): the caller fails that request alone."""

    def __init__(self, cfg: EngineConfig, parts: CoreParts) -> None:
        """``cfg`` as it applies on the device (``EngineConfig.on_device``); build one with
        :func:`~voicert.engine.build.build_core`."""
        self.cfg = cfg
        self.model = parts.model
        self.tokenizer = parts.tokenizer
        self.prompts = parts.prompts
        self.guides = parts.guides
        self.blocks = parts.blocks
        self.runner = parts.runner
        self.scheduler = parts.scheduler
        self.stop_ids = parts.stop_ids
        self.heads = parts.heads
        self.drafter = parts.drafter
        self.turn_head = parts.turn_head
        self._ahead: tuple[Step, Pending] | None = None  # a decode step launched ahead
        self._failed_draws: list[Sequence] = []  # sampled rows whose draw failed this step
        self._read_ns = 0  # when the last step's tokens were read
        self.ahead_steps = 0  # decode steps launched before the previous step's tokens were read
        self.step_records: collections.deque[StepRecord] = collections.deque(maxlen=8192)
        self.guided_steps = 0  # steps with a grammar-guided row, and the host time their masks took
        self.guide_ns = 0

    # ------------------------------------------------------------ the three calls

    def add(
        self, request: GenerationRequest, guide: Guide | None = None, built: bool = False
    ) -> None:
        """Queue a checked request (its prompt templated here unless ``prompt_ids`` is given).
        ``built``: its ``guide`` was built off this thread (``guides.for_request``; None for a
        request without tools); else it is built here, raising GuideError for an unusable
        schema."""
        budget = self.cfg.max_context_tokens - request.max_new_tokens
        if not built:
            guide = self.guides.for_request(request)
        tools = offered(request.tools, request.tool_choice)
        score_id = -1
        if request.score_end:
            prompt, score_id = self.prompts.build_open(request.messages, budget, self.stop_ids)
        elif request.prompt_ids is not None:
            prompt = list(request.prompt_ids)
        else:
            prompt = self.prompts.build(request.messages, budget, tools)
        seq = Sequence(request, prompt, arrival_ns=time.perf_counter_ns(), guide=guide)
        seq.score_id = score_id
        if not request.sampling.greedy and not request.score_end:
            seq.sampler = Sampler(request.sampling, self.cfg.device)
        self.scheduler.add(seq)

    def abort(self, request_id: str) -> list[TokenOut]:
        """Stop a request and free its state; its final record (``cancelled``), or nothing when the
        core does not hold it (finished, never added)."""
        seq = self.scheduler.cancel(request_id)
        return [] if seq is None else [self._end(seq, FinishReason.CANCELLED)]

    def warmup(self) -> None:
        """Run a short request through the whole path once (blocking; before a thread owns the
        core). Its steps are not counted. Guided decoding's tokenizer is made here too."""
        self.guides.warm()
        self.add(GenerationRequest("warmup", [ChatMessage("user", "Hello")], 4))
        while self.has_work():
            self.step()
        self.drain_steps()

    def has_work(self) -> bool:
        return self.scheduler.has_work() or self._ahead is not None

    def step(self, run_ahead: bool = True) -> list[TokenOut]:
        """One engine step: schedule it (or take the one launched ahead), run it (launching the
        one after it too when allowed: ``run_ahead``, the caller has no arrivals waiting, and the
        scheduler can plan it, its inputs fed on the GPU from this step's results; then read this
        step's tokens while the GPU runs the next), and postprocess its tokens. Returns the
        step's records: tokens in order, each finished request's final one."""
        now = time.perf_counter_ns()
        out: list[TokenOut] = []
        launched = self._schedule(now, out)
        if launched is None:
            return out
        step, pending, began = launched
        tokens, drafts = self._run(step, pending, run_ahead)
        out.extend(self._postprocess(step, tokens, drafts, now, began))
        return out

    def _schedule(self, now: int, out: list[TokenOut]) -> tuple[Step, Pending, int] | None:
        """(the step, its launched work, when its work began): the one launched ahead (its work
        began when the step before it was read), else the scheduler's next, launched now; None
        when there is nothing to run. Requests that can never fit end here (into ``out``)."""
        if self._ahead is not None:
            (step, pending), self._ahead = self._ahead, None
            self.scheduler.bind_ahead(step)
            return step, pending, self._read_ns
        planned, failed = self.scheduler.schedule()
        for seq in failed:
            out.append(self._end(seq, FinishReason.ERROR, "prompt does not fit in the KV pool"))
        if planned is None:
            return None
        step = planned
        for chunk in step.chunks:
            if not chunk.seq.prefill_start_ns:
                chunk.seq.prefill_start_ns = now
        if self.drafter is not None and step.kind == "decode":
            self.drafter.propose(step.seqs, step.drafts)
            for seq in step.seqs:
                if not seq.speculates:
                    seq.draft = []  # picked under a grammar's mask, one token a step
        return step, self.runner.launch(step), now

    def _run(
        self, step: Step, pending: Pending, run_ahead: bool
    ) -> tuple[list[list[int]], list[list[list[int]]] | None]:
        """Launch the next step behind this one where allowed, then wait for this one's tokens
        (per row; guided rows' picks under their grammars) and drafts."""
        if run_ahead and self.cfg.overlap and self.runner.graphs is not None:
            nxt = self.scheduler.plan_ahead(step)
            if nxt is not None:
                ahead = self.runner.launch_ahead(nxt, pending)
                self._ahead = (nxt, ahead) if ahead is not None else None
                self.ahead_steps += ahead is not None
        result = pending.result()
        if rows := step.scoring:
            self._score(step, pending, rows)
        if step.host_picks:
            self._draws(step, pending, result.tokens)
        if step.guided:
            t0 = time.perf_counter_ns()
            self._guide_picks(step, pending, result.tokens)
            self.guide_ns += time.perf_counter_ns() - t0
        return result.tokens, result.drafts

    def _postprocess(
        self,
        step: Step,
        tokens: list[list[int]],
        drafts: list[list[list[int]]] | None,
        now: int,
        began: int,
    ) -> list[TokenOut]:
        """The scheduler takes the step's tokens (accepting drafts, finishing requests); the
        step is timed and recorded; its records go out."""
        emitted = self.scheduler.postprocess(step, tokens, drafts)
        failed, self._failed_draws = self._failed_draws, []
        for seq in failed:
            if seq.finish_reason is None:
                self.scheduler.finish(seq, FinishReason.ERROR)
        if step.guided:
            t0 = time.perf_counter_ns()
            self._guide_advance(emitted)
            self.guide_ns += time.perf_counter_ns() - t0
            self.guided_steps += 1
        sampled_ns = time.perf_counter_ns()
        self.scheduler.observe(step, (sampled_ns - began) / 1e9)  # a step's share of the pipeline
        self._read_ns = sampled_ns
        kind = "verify" if step.kind == "decode" and step.drafts else step.kind
        self.step_records.append(
            StepRecord(kind, len(step.chunks) + len(step.seqs), (sampled_ns - now) / 1e9)
        )
        out: list[TokenOut] = []
        for seq, new in emitted:
            if any(seq is f for f in failed):
                new = []  # the step's greedy stand-in for the draw that failed is not sent
            if seq.scores:  # its answer is a probability, in its final record
                self.scheduler.finish(seq, FinishReason.STOP)
                out.append(self._end(seq, FinishReason.STOP))
                continue
            first = seq.num_generated - len(new)
            n_prompt = len(seq.prompt)
            out.extend(
                TokenOut(seq.id, first + j, tok, sampled_ns, seq.prefill_start_ns, n_prompt)
                for j, tok in enumerate(new)
            )
            if seq.finish_reason is not None:
                out.append(self._end(seq, seq.finish_reason, seq.error))
        return out

    def _score(self, step: Step, pending: Pending, rows: list[int]) -> None:
        """Each scoring row's probability of its asked-for token after its prompt, and the
        end-of-turn head's probability from the same hidden state (one batch each)."""
        logits = pending.logits_rows(rows).float()  # [len(rows), V]
        ids = [step.chunks[i].seq.score_id for i in rows]
        probs = logits.softmax(-1)[range(len(rows)), ids].tolist()
        heads = self.turn_head.prob(pending.hidden_rows(rows)) if self.turn_head else None
        for k, (i, p) in enumerate(zip(rows, probs)):
            step.chunks[i].seq.end_prob = p
            step.chunks[i].seq.turn_prob = heads[k] if heads is not None else None

    def _draws(self, step: Step, pending: Pending, tokens: list[list[int]]) -> None:
        """Replace each sampled row's greedy tokens by its draws (in place), over what its
        grammar allows when it has one. A row with drafts is verified by rejection sampling;
        its tokens become the emitted ones, which the scheduler's greedy acceptance reads back
        unchanged (the drafts kept, then a token that differs from the next draft, or the
        bonus token)."""
        seqs = [c.seq for c in step.chunks] if step.kind == "prefill" else step.seqs
        rows = [
            i for i, s in enumerate(seqs) if s.sampler is not None and tokens[i] and not s.scores
        ]
        if not rows:
            return
        vocab = self.model.cfg.vocab_size
        logits = pending.logits_rows(rows)  # [len(rows), >= V]
        for k, i in enumerate(rows):
            seq = seqs[i]
            assert seq.sampler is not None
            if step.kind == "decode" and seq.draft:
                span = pending.logits_span(i, len(seq.draft) + 1)  # [drafts + 1, >= V]
                emitted = seq.sampler.verify(seq.draft, span[:, :vocab])
                tokens[i][: len(emitted)] = emitted
                continue
            allowed = seq.guide.allowed(logits.device) if seq.guide is not None else None
            try:
                tokens[i][0] = seq.sampler.draw(logits[k, :vocab], allowed)
            except (RuntimeError, ValueError) as exc:  # this row's draw, not the step: it alone
                log.warning("engine: %s: its draw failed: %s", seq.id, exc)  # ends (the greedy
                seq.error = f"sampling failed: {exc}"  # token stays for the scheduler, unsent)
                self._failed_draws.append(seq)

    def _guide_picks(self, step: Step, pending: Pending, tokens: list[list[int]]) -> None:
        """Replace each guided row's greedy token that its grammar refuses by the best one it
        allows (in place; guided rows carry no drafts, so one token per row). Sampled rows drew
        theirs under their grammar already."""
        seqs = [c.seq for c in step.chunks] if step.kind == "prefill" else step.seqs
        refused = [
            (i, guide)
            for i, seq in enumerate(seqs)
            if (guide := seq.guide) is not None
            and seq.sampler is None
            and tokens[i]
            and not guide.allows(tokens[i][0])
        ]
        if refused:  # their logits, their masks: one batch
            rows = [i for i, _ in refused]
            best = masked_argmax(
                [g for _, g in refused], pending.logits_rows(rows), self.guides.executor
            )
            for i, tok in zip(rows, best):
                tokens[i][0] = tok

    def _guide_advance(self, emitted: list[tuple[Sequence, list[int]]]) -> None:
        """Move each guided sequence's grammar past its new token; one whose grammar allows
        nothing more is finished (``stop``) now rather than after one more step."""
        for seq, toks in emitted:
            if seq.guide is None or seq.finish_reason is not None:
                continue
            try:
                for tok in toks:
                    seq.guide.advance(tok)
            except GuideError as exc:  # its grammar went over the limits: fail the one request
                log.warning("engine: %s: %s", seq.id, exc)
                seq.error = f"{BAD_REQUEST}{exc}"  # its schema's fault, not the engine's
                self.scheduler.finish(seq, FinishReason.ERROR)
                continue
            if seq.guide.finished:
                self.scheduler.finish(seq, FinishReason.STOP)

    def fail_all(self, error: str) -> list[TokenOut]:
        """End every request the core holds with ``error`` and free its state (after a failed
        step, or when the owning thread is dying)."""
        self._ahead = None
        out = []
        sched = self.scheduler
        for seq in list(sched.running) + list(sched.waiting):
            try:
                sched.cancel(seq.id)
            except Exception:  # the scheduler may be what broke; the requests still end
                log.exception("engine: cancelling %s", seq.id)
            out.append(self._end(seq, FinishReason.ERROR, error))
        return out

    def load(self) -> EngineLoad:
        """A snapshot of the figures other threads may read (take it on the core's thread)."""
        sched, spec = self.scheduler, self.scheduler.spec
        return EngineLoad(
            len(sched.waiting),
            len(sched.running),
            self.blocks.stats.hit_ratio,
            spec.acceptance_rate,
            spec.mean_accepted_length,
            self.blocks.available,
        )

    def drain_steps(self) -> list[StepRecord]:
        """The steps since the last call (for metrics; the most recent 8192 at most)."""
        out = []
        while self.step_records:
            out.append(self.step_records.popleft())
        return out

    def _end(self, seq: Sequence, reason: str, error: str | None = None) -> TokenOut:
        """Free the engine-side state of a finished sequence; its final record."""
        if self.drafter is not None:
            self.drafter.release(seq.id)
        return TokenOut(
            seq.id,
            seq.num_generated,
            -1,
            time.perf_counter_ns(),
            seq.prefill_start_ns or 0,
            len(seq.prompt),
            reason,
            error,
            seq.end_prob,
            seq.turn_prob,
        )
