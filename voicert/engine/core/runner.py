"""The model runner: owns the model and every tensor (the KV pool), turns a scheduler Step into one
padded forward, and hands back greedy tokens. The only host sync per step is the final ``tolist``."""

from __future__ import annotations

import gc
import logging
from dataclasses import dataclass

import numpy as np
import torch

from voicert.engine.core.heads import DraftHeads
from voicert.engine.core.kv_cache import SCRATCH_BLOCK
from voicert.engine.core.scheduler import Step, bucket
from voicert.engine.models.base import Model
from voicert.engine.models.layers import KeyGroups, narrow_linears, plan_groups, pool_row
from voicert.engine.models.llama import AttnInputs

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Row:
    tokens: list[int]  # the tokens this row feeds
    start: int  # absolute position of tokens[0]
    table: list[int]  # the sequence's block ids
    sample_from: int  # logits from this row index onwards are sampled (len(tokens): none)


@dataclass(slots=True)
class StepOutput:
    tokens: list[list[int]]  # per row: the greedy token after each sampled position
    # with draft heads: per row, per sampled position, the heads' guesses of the tokens after
    # that position's greedy token; None without heads
    drafts: list[list[list[int]]] | None = None


def rows_for(step: Step) -> list[Row]:
    if step.kind == "prefill":
        return [
            Row(
                c.seq.tokens[c.start : c.end],
                c.start,
                c.seq.blocks.table,
                (c.end - c.start - 1) if c.samples else (c.end - c.start),
            )
            for c in step.chunks
        ]
    return [Row([s.tokens[-1], *s.draft], len(s.tokens) - 1, s.blocks.table, 0) for s in step.seqs]


BATCH_LADDER = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)
SPAN_LADDER = (256, 512, 1024, 2048, 4096, 8192)  # attended key span (tokens) per graph
PREFILL_LADDER = (16, 32, 64, 128, 256, 512, 1024, 2048)  # new tokens per row of a prefill
PREFILL_BATCHES = (1, 2, 4, 8, 16)  # rows of a prefill step (graphs with rows * width <= budget)


class ModelRunner:
    def __init__(
        self,
        model: Model,
        num_blocks: int,
        block_size: int,
        cuda_graphs: bool = False,
        max_batch: int = 64,
        max_context: int = 2048,
        widths: tuple[int, ...] = (1,),
        prefill_budget: int = 512,
        prefill_rows: int = 16,
        heads: DraftHeads | None = None,
        torchscript: bool = False,
        kv_dtype: torch.dtype | None = None,
    ) -> None:
        """``kv_dtype``: the KV pool's dtype (None: the model's; torch.float8_e4m3fn or
        torch.int8: llm.kv_cache fp8 / int8, written rounded and read widened: models/layers.py,
        kernels/attention.py)."""
        cfg = model.cfg
        self.model = model
        self.heads = heads
        self.forward = model
        self.block_size = block_size
        self.num_blocks = num_blocks
        p = next(model.parameters())
        self.device, self.dtype = p.device, p.dtype
        self.kv_dtype = kv_dtype or self.dtype
        shape = (
            cfg.num_layers,
            num_blocks,
            block_size,
            cfg.num_kv_heads,
            pool_row(cfg.head_dim, self.kv_dtype),
        )
        self.k_pool = torch.zeros(
            shape, dtype=self.kv_dtype, device=self.device
        )  # [layers, NB, BS, KVH, D]
        self.v_pool = torch.zeros(shape, dtype=self.kv_dtype, device=self.device)
        self.graphs = self.prefill_graphs = None
        self.eager_steps = {"prefill": 0, "decode": 0}  # steps no captured graph could take
        # the CPU path attends in groups of rows of like key spans (layers.KeyGroups); the GPU
        # kernels read each row's own blocks, and a one-byte pool is widened on the padded path
        self.key_groups = (
            self.device.type == "cpu" and not model.use_kernels and self.kv_dtype == self.dtype
        )
        if self.device.type == "cpu":
            narrow_linears(model)  # a step's few rows as MKL's narrow side (layers._few_rows)
        if torchscript and self.device.type == "cpu":
            self.forward = traced_forward(model, self.k_pool, self.v_pool, block_size)
        if cuda_graphs and self.device.type == "cuda":
            batches = [b for b in BATCH_LADDER if b < max_batch] + [max_batch]
            self.graphs = StepGraphs(self, batches, list(widths), max_context, sample_last=False)
            pw = [w for w in PREFILL_LADDER if w < prefill_budget] + [prefill_budget]
            rows = [b for b in PREFILL_BATCHES if b < prefill_rows] + [max(prefill_rows, 1)]
            self.prefill_graphs = StepGraphs(
                self, rows, pw, max_context, sample_last=True, max_tokens=prefill_budget
            )

    @staticmethod
    def kv_bytes_per_block(model: Model, block_size: int, dtype: torch.dtype) -> int:
        cfg = model.cfg
        elem = torch.tensor([], dtype=dtype).element_size()
        return (
            2
            * cfg.num_layers
            * block_size
            * cfg.num_kv_heads
            * pool_row(cfg.head_dim, dtype)
            * elem
        )

    def layout(self, rows: list[Row], batch: int, blocks: int, width: int):
        """Row-major int64 lists (ids, positions, slots, tables) padded to [batch, width] and
        [batch, blocks]; padding tokens feed id 0 at position 0 and write the scratch slot."""
        bs = self.block_size
        ids = [[0] * width for _ in range(batch)]
        pos = [[0] * width for _ in range(batch)]
        slots = [[SCRATCH_BLOCK * bs] * width for _ in range(batch)]
        tables = [[SCRATCH_BLOCK] * blocks for _ in range(batch)]
        for i, r in enumerate(rows):
            n = len(r.tokens)
            ids[i][:n] = r.tokens
            pos[i][:n] = range(r.start, r.start + n)
            slots[i][:n] = [r.table[p // bs] * bs + p % bs for p in range(r.start, r.start + n)]
            used = -(-(r.start + n) // bs)
            tables[i][:used] = r.table[:used]
        return ids, pos, slots, tables

    def prepare(self, rows: list[Row]) -> tuple[torch.Tensor, AttnInputs]:
        q = max(len(r.tokens) for r in rows)
        blocks = [-(-(r.start + len(r.tokens)) // self.block_size) for r in rows]
        ids, pos, slots, tables = self.layout(rows, len(rows), max(blocks), q)
        dev = self.device
        inp = AttnInputs(
            positions=torch.tensor(pos, device=dev),  # [B, Q]
            slots=torch.tensor(slots, device=dev).view(-1),  # [B*Q]
            block_tables=torch.tensor(tables, device=dev),  # [B, MB]
            groups=self.key_groups_of(blocks),
        )
        return torch.tensor(ids, device=dev), inp

    def key_groups_of(self, blocks: list[int]) -> KeyGroups | None:
        """The groups rows that attend ``blocks[i]`` key blocks attend in (layers.plan_groups),
        or None: one group pays, or this runner pads every row (GPU kernels, a one-byte pool)."""
        if not self.key_groups or len(blocks) < 2:
            return None
        groups = plan_groups(blocks)
        if len(groups) < 2:
            return None
        order, bounds, at = [], [], 0
        for rows, span in groups:
            order += rows
            bounds.append([at, at + len(rows), span])
            at += len(rows)
        return KeyGroups(torch.tensor(order), torch.tensor(bounds))

    def run(self, step: Step) -> list[list[int]]:
        """One forward for the step. Returns, per row, the greedy token after each sampled
        position (prefill rows that finish their prompt: one; decode rows: len(draft) + 1)."""
        return self.run_step(step).tokens

    def run_step(self, step: Step) -> StepOutput:
        """:meth:`run`, plus the draft heads' guesses at each sampled position (with heads)."""
        return self.launch(step).result()

    @torch.inference_mode()
    def launch(self, step: Step) -> Pending:
        """Start the step's forward; its tokens come from the returned handle's ``result()``.
        A step replayed from a CUDA graph is only queued on the GPU (the host is free until it
        asks for the result); one that no graph fits runs eagerly here and is done."""
        rows = rows_for(step)
        graphs = self.graphs if step.kind == "decode" else self.prefill_graphs
        if graphs is not None:
            pending = graphs.launch(rows)
            if pending is not None:
                return pending
            self.eager_steps[step.kind] += 1
        if step.reads_logits:
            out, kept, at = self.forward_rows(rows, keep_logits=True)
            return Pending(output=out, eager_kept=kept, eager_at=at)
        return Pending(output=self.forward_rows(rows))

    @torch.inference_mode()
    def launch_ahead(self, step: Step, after: Pending) -> Pending | None:
        """Queue the decode step that follows ``after`` (just launched), before ``after``'s
        tokens are read. Row i of ``step`` is row i of ``after`` and has its width (1 + drafts):
        it feeds, on the GPU, the greedy token after ``after``'s last accepted draft and (with
        draft heads) the heads' guesses there, at the positions that follow (see
        :func:`feed_step`); each sequence's blocks already hold the slots the most accepted
        drafts would need. None when it cannot: ``after`` is not the latest replay of the decode
        graphs or has other rows, or no graph fits."""
        graphs = self.graphs
        if graphs is None or after is not graphs.latest or len(after.rows) != len(step.seqs):
            return None
        w = after.width  # laid out for the most accepted drafts (w - 1); feed_step moves it back
        rows = [Row([0] * w, len(s.tokens) + w - 1, s.blocks.table, 0) for s in step.seqs]
        return graphs.launch(rows, fed=True)

    def run_rows(self, rows: list[Row]) -> list[list[int]]:
        """Eager forward of arbitrary rows; greedy tokens after each sampled position."""
        return self.forward_rows(rows).tokens

    @torch.inference_mode()
    def forward_rows(self, rows: list[Row], keep_logits: bool = False):
        """Eager forward; a StepOutput, or with ``keep_logits`` (StepOutput, the target's
        (logits [P, V], final hidden state [P, hidden]) at the sampled positions, {(row, position
        in row): index into them})."""
        input_ids, inp = self.prepare(rows)
        hidden = self.forward(input_ids, inp, self.k_pool, self.v_pool)  # [B, Q, hidden]
        picks = [(i, j) for i, r in enumerate(rows) for j in range(r.sample_from, len(r.tokens))]
        if not picks:
            out = StepOutput([[] for _ in rows], [[] for _ in rows] if self.heads else None)
            return (out, None, {}) if keep_logits else out
        bi = torch.tensor([i for i, _ in picks], device=self.device)
        qi = torch.tensor([j for _, j in picks], device=self.device)
        h = self.with_heads(hidden[bi, qi])  # [1 + heads, P, hidden]
        logits = self.model.logits(h) if keep_logits else None  # [1 + heads, P, V]
        best = (logits.argmax(-1) if keep_logits else self.model.greedy(h)).tolist()  # host sync
        out = StepOutput([[] for _ in rows], [[] for _ in rows] if self.heads else None)
        for p, (i, _) in enumerate(picks):
            out.tokens[i].append(best[0][p])
            if out.drafts is not None:
                out.drafts[i].append([row[p] for row in best[1:]])
        if keep_logits:
            at = {(i, j - rows[i].sample_from): p for p, (i, j) in enumerate(picks)}
            return out, (logits[0], h[0]), at
        return out

    def with_heads(self, h: torch.Tensor) -> torch.Tensor:
        """h [P, hidden] -> [1 + heads, P, hidden]: the target's own input to the LM head first,
        then each draft head's (one LM-head matmul reads the weights once for all)."""
        if self.heads is None:
            return h.unsqueeze(0)
        return torch.cat([h.unsqueeze(0), self.heads(h)])


class _Unpacked(torch.nn.Module):
    """The model's forward over plain tensors (a trace takes tensors, not AttnInputs)."""

    def __init__(self, model: Model) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids, positions, slots, block_tables, k_pool, v_pool):
        return self.model(ids, AttnInputs(positions, slots, block_tables), k_pool, v_pool)


class _Grouped(_Unpacked):
    """:class:`_Unpacked` for steps whose rows attend in key groups (layers.KeyGroups)."""

    def forward(self, ids, positions, slots, block_tables, order, bounds, k_pool, v_pool):
        inp = AttnInputs(positions, slots, block_tables, KeyGroups(order, bounds))
        return self.model(ids, inp, k_pool, v_pool)


class TracedForward:
    """The model's forward as a frozen TorchScript trace, called like the model. On the CPU a
    decode step is mostly per-op overhead (~25 small ops per layer, each through Python and the
    dispatcher; the INT8 Linear modules add Python of their own); TorchScript's interpreter runs
    the same ATen ops from C++. Same ops, so the same bits (tests compare hidden states and KV
    writes with the eager forward over batch sizes, query widths and context lengths). Two
    traces: rows padded to one key span, and rows in key groups (the loop over groups is a
    scripted function the trace calls, so it runs for however many groups a step has)."""

    def __init__(self, fn, grouped) -> None:
        self.fn = fn
        self.grouped = grouped

    def __call__(
        self, ids: torch.Tensor, inp: AttnInputs, k_pool: torch.Tensor, v_pool: torch.Tensor
    ) -> torch.Tensor:
        if inp.groups is None:
            return self.fn(ids, inp.positions, inp.slots, inp.block_tables, k_pool, v_pool)
        g = inp.groups
        return self.grouped(
            ids, inp.positions, inp.slots, inp.block_tables, g.order, g.bounds, k_pool, v_pool
        )


def traced_forward(model: Model, k_pool: torch.Tensor, v_pool: torch.Tensor, block_size: int):
    """A :class:`TracedForward` of ``model`` (traced on a one-token row that writes the scratch
    slot), or the model itself when tracing fails (logged). Shapes are not baked in: the trace
    records them as size ops, so any batch, width and block-table length runs through it."""
    scratch = SCRATCH_BLOCK * block_size
    row = (
        torch.zeros(1, 1, dtype=torch.long),
        torch.zeros(1, 1, dtype=torch.long),
        torch.full((1,), scratch, dtype=torch.long),
        torch.full((1, 1), SCRATCH_BLOCK, dtype=torch.long),
    )
    group = (torch.zeros(1, dtype=torch.long), torch.tensor([[0, 1, 1]]))  # one row, one block
    try:
        with torch.inference_mode():
            return TracedForward(
                _trace(_Unpacked(model), (*row, k_pool, v_pool)),
                _trace(_Grouped(model), (*row, *group, k_pool, v_pool)),
            )
    except Exception as exc:  # an op the tracer cannot take: the eager forward still works
        log.warning("TorchScript trace of the forward failed (%s); running it eagerly", exc)
        return model


def _trace(module: torch.nn.Module, example: tuple):
    traced = torch.jit.trace(module.eval(), example, check_trace=False)
    return torch.jit.freeze(traced, optimize_numerics=False)


@dataclass(slots=True, eq=False)
class Pending:
    """A launched step. ``result()`` waits for it (the step's one host sync) and reads its tokens."""

    output: StepOutput | None = None  # set when done
    graphs: StepGraphs | None = None
    rows: list[Row] | None = None
    width: int = 0
    slot: int = 0  # which pinned staging / output buffers it used
    copied: bool = False  # its tokens are being copied into pinned memory (see StepGraphs.stash)
    # an eager step that reads logits: (logits [P, V] it sampled from, hidden [P, hidden] they
    # came from), and (row, sample) -> index into them
    eager_kept: tuple[torch.Tensor, torch.Tensor] | None = None
    eager_at: dict[tuple[int, int], int] | None = None

    def result(self) -> StepOutput:
        if self.output is None:
            self.output = self.graphs.collect(self)
        return self.output

    def logits_rows(self, rows: list[int]) -> torch.Tensor:
        """The target model's logits [len(rows), V] (on its device) that each of ``rows`` picked
        its first sampled token from. Valid after :meth:`result` and until the next step is
        launched; for a step whose ``reads_logits`` is set."""
        if self.eager_kept is not None:
            return self._eager_at(self.eager_kept[0], [(r, 0) for r in rows])
        return self.graphs.logits_rows(self, rows)

    def hidden_rows(self, rows: list[int]) -> torch.Tensor:
        """The target's final hidden state [len(rows), hidden] those logits came from (same
        validity; a prefill step's rows only, when replayed from a graph)."""
        if self.eager_kept is not None:
            return self._eager_at(self.eager_kept[1], [(r, 0) for r in rows])
        return self.graphs.hidden_rows(self, rows)

    def logits_span(self, row: int, n: int) -> torch.Tensor:
        """The target's logits [n, V] at ``row``'s first ``n`` sampled positions (a decode
        row verifying n - 1 drafts: after its last token and after each draft); same validity
        as :meth:`logits_rows`."""
        if self.eager_kept is not None:
            return self._eager_at(self.eager_kept[0], [(row, j) for j in range(n)])
        return self.graphs.logits_span(self, row, n)

    def _eager_at(self, kept: torch.Tensor, picks: list[tuple[int, int]]) -> torch.Tensor:
        """``kept``'s rows [len(picks), ...] at (row, sampled position) ``picks``."""
        at = torch.tensor([self.eager_at[pick] for pick in picks], device=kept.device)
        return kept.index_select(0, at)


class StepGraphs:
    """CUDA graphs of one greedy step over ladders of batch size, query width and key span.

    Decode (``sample_last=False``): widths 1 (plain) and k + 1 (verifying k speculative drafts);
    every query position is sampled. Prefill (``sample_last=True``): a few rows, widths up to the
    prefill budget (rows * width <= ``max_tokens``); only each row's last real token is sampled.
    Graphs are replayed, never launched kernel by kernel: a step is one submission to the GPU, so
    it does not stretch when another process's kernels time-share the GPU with it.

    Inputs live in static device buffers, staged through pinned host buffers and copied without
    blocking; the graph computes the forward, the logits and the argmax, so a step is one H2D
    copy, one replay and one read of its tokens. Decode graphs can take a row's input token from
    the previous replay's output on the GPU (``fed``): a step can be queued before the host has
    read the tokens of the one before it, whose tokens are then copied into pinned memory first
    (``stash``). Two sets of pinned buffers alternate, so staging step N + 1 never overwrites the
    inputs of step N before its copy has run, nor its output before the host has read it."""

    def __init__(
        self,
        runner: ModelRunner,
        batches: list[int],
        widths: list[int],
        max_context: int,
        sample_last: bool,
        max_tokens: int = 8192,
    ) -> None:
        self.runner = runner
        self.max_tokens = max_tokens
        self.sample_last = sample_last
        bs = runner.block_size
        self.widths = sorted(set(widths))
        self.batches = sorted(b for b in set(batches) if b * self.widths[0] <= max_tokens)
        spans = [s for s in SPAN_LADDER if s < max_context] + [max_context]
        self.blocks = sorted({-(-s // bs) for s in spans})
        mb, mbk, mw = self.batches[-1], self.blocks[-1], self.widths[-1]
        dev = runner.device
        # All inputs live in one int64 device buffer (one H2D copy per step) at fixed offsets:
        # ids/pos/slots/src [MB*W] each, tables [MB*MBK], last [MB]. out [MB*W] is separate.
        # src[i * W] >= 0: row i takes its inputs from that row of the previous replay's
        # results (feed_step); -1: the staged ones.
        sizes = {
            "ids": mb * mw,
            "pos": mb * mw,
            "slots": mb * mw,
            "src": mb * mw,
            "tables": mb * mbk,
            "last": mb,
        }
        self.offsets: dict[str, int] = {}
        total = 0
        for name, n in sizes.items():
            self.offsets[name] = total
            total += n
        self.packed = torch.zeros(total, dtype=torch.long, device=dev)
        self.host = [torch.zeros(total, dtype=torch.long).pin_memory() for _ in range(2)]
        self.host_np = [h.numpy() for h in self.host]
        for name, n in sizes.items():
            setattr(self, name, self.packed[self.offsets[name] : self.offsets[name] + n])
        self.src.fill_(-1)  # warm-up and capture run on these buffers: feed nothing there
        # out[0]: greedy tokens; out[1 + i]: draft head i's guesses (with heads)
        nh = runner.heads.num_heads if runner.heads is not None else 0
        self.out = torch.zeros(1 + nh, mb * mw, dtype=torch.long, device=dev)
        # the LM head's output of the last replay, [(1 + heads) * rows, V] (read for guided rows)
        vocab = runner.model.cfg.vocab_size
        self.head_out = torch.empty((1 + nh) * mb * mw * vocab, dtype=runner.dtype, device=dev)
        # prefill: the target's final hidden state at each row's sampled position [MB, hidden]
        # (read for scoring rows: engine/core/turn_head.py)
        hidden = runner.model.cfg.hidden_size
        self.hidden_out = torch.empty(
            mb if sample_last else 0, hidden, dtype=runner.dtype, device=dev
        )
        self.acc = torch.zeros(mb, dtype=torch.long, device=dev)  # drafts accepted per row
        self.out_host = [
            torch.zeros(1 + nh, mb * mw, dtype=torch.long).pin_memory() for _ in range(2)
        ]
        self.done = [torch.cuda.Event() for _ in range(2)]
        self.turn = 0  # which set of pinned buffers (and event) the next launch uses
        self.latest: Pending | None = None  # the last launch (its tokens are in self.out)
        self.graphs: dict[tuple[int, int, int], torch.cuda.CUDAGraph] = {}
        self._capture()

    def _step(self, forward, b: int, nblk: int, w: int) -> None:
        ids = self.ids[: b * w].view(b, w)
        kern = self.runner.model.use_kernels
        if not self.sample_last:  # decode: inputs fed from the previous replay's results
            feed_step(
                ids,
                self.pos[: b * w].view(b, w),
                self.slots[: b * w].view(b, w),
                self.src[: b * w].view(b, w),
                self.tables[: b * nblk].view(b, nblk),
                self.out,
                self.acc,
                self.runner.block_size,
                kern,
            )
        inp = AttnInputs(
            self.pos[: b * w].view(b, w), self.slots[: b * w], self.tables[: b * nblk].view(b, nblk)
        )
        h = forward(ids, inp, self.runner.k_pool, self.runner.v_pool)  # [b, w, hidden]
        if self.sample_last:
            h = h[torch.arange(b, device=h.device), self.last[:b]]  # [b, hidden]
            self.hidden_out[:b].copy_(h)
        h = self.runner.with_heads(h.reshape(-1, h.shape[-1]))  # [1 + heads, N, hidden]
        head_out = self.head_out[: h.shape[0] * h.shape[1] * self.vocab].view(
            h.shape[0], h.shape[1], self.vocab
        )  # [1 + heads, N, V]
        self.runner.model.greedy(h, out=self.out[:, : h.shape[1]], head_out=head_out)
        if not self.sample_last:  # what the next step, if fed from this one, starts from
            accept_counts(ids, self.out[0], self.acc, kern)

    @torch.inference_mode()
    def _capture(self) -> None:
        # Garbage collected mid-capture (a freed pinned buffer records CUDA events) would invalidate
        # the capture: collect first, and keep the collector off until every graph is captured.
        gc.collect()
        gc.disable()
        try:
            self._capture_all()
        finally:
            gc.enable()

    def _capture_all(self) -> None:
        forward = self.runner.forward
        pool = torch.cuda.graph_pool_handle()
        for w in reversed(self.widths):
            for b in reversed(self.batches):
                for nblk in reversed(self.blocks):
                    if b * w > self.max_tokens:
                        continue  # never scheduled: above the prefill budget
                    stream = torch.cuda.Stream()
                    stream.wait_stream(torch.cuda.current_stream())
                    with torch.cuda.stream(stream):  # warm up kernels / compilation outside
                        for _ in range(2):
                            self._step(forward, b, nblk, w)
                    torch.cuda.current_stream().wait_stream(stream)
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
                        self._step(forward, b, nblk, w)
                    self.graphs[(b, nblk, w)] = graph
        torch.cuda.synchronize()

    def run(self, rows: list[Row]) -> StepOutput | None:
        """Replay the smallest graph that fits and wait for its tokens; None when none fits (the
        caller runs eagerly)."""
        pending = self.launch(rows)
        return pending.result() if pending is not None else None

    def launch(self, rows: list[Row], fed: bool = False) -> Pending | None:
        """Stage and replay the smallest graph that fits (queued, not waited for); None when none
        does. ``fed`` (decode graphs): row i takes its inputs from row i of the previous replay
        (of the same width; see :func:`feed_step`), its tokens and positions here being
        placeholders for the most drafts accepted."""
        n = len(rows)
        width = max(len(r.tokens) for r in rows)
        need = max(-(-(r.start + len(r.tokens)) // self.runner.block_size) for r in rows)
        b, nblk, w = bucket(n, self.batches), bucket(need, self.blocks), bucket(width, self.widths)
        if b is None or nblk is None or w is None or (b, nblk, w) not in self.graphs:
            return None
        ids, pos, slots, tables = self.runner.layout(rows, b, nblk, w)
        src = [-1] * (b * w)
        if fed:
            src[: n * w : w] = range(n)
        staged = {
            "ids": ids,
            "pos": pos,
            "slots": slots,
            "src": src,
            "tables": tables,
            "last": [len(r.tokens) - 1 for r in rows] + [0] * (b - n),
        }
        last = self.latest
        if last is not None and last.output is None and not last.copied:
            self.stash(last)  # not read yet: the replay below overwrites its output on the GPU
        slot = self.turn
        self.turn ^= 1
        host_np = self.host_np[slot]
        for name, values in staged.items():
            flat = np.asarray(values, dtype=np.int64).reshape(-1)
            at = self.offsets[name]
            host_np[at : at + flat.size] = flat
        self.packed.copy_(self.host[slot], non_blocking=True)  # one H2D copy
        self.graphs[(b, nblk, w)].replay()
        self.latest = Pending(graphs=self, rows=rows, width=w, slot=slot)
        return self.latest

    def _used(self, pending: Pending) -> int:
        return len(pending.rows) * (1 if self.sample_last else pending.width)

    def stash(self, pending: Pending) -> None:
        """Queue the copy of ``pending``'s tokens into its pinned output buffer, so that a later
        replay may overwrite them on the GPU before the host reads them."""
        used = self._used(pending)
        self.out_host[pending.slot][:, :used].copy_(self.out[:, :used], non_blocking=True)
        self.done[pending.slot].record()
        pending.copied = True

    def tokens(self, pending: Pending) -> list[list[int]]:
        """[1 + heads][used] tokens of a launched step: the step's one host sync. Read from the
        GPU output when nothing was queued after it, else from its pinned copy."""
        used = self._used(pending)
        if not pending.copied:
            return self.out[:, :used].tolist()
        self.done[pending.slot].synchronize()
        return self.out_host[pending.slot][:, :used].tolist()

    @property
    def vocab(self) -> int:
        return self.runner.model.cfg.vocab_size

    def logits_rows(self, pending: Pending, rows: list[int]) -> torch.Tensor:
        """[len(rows), V]: each row's logits at its first sampled position, from the LM head's
        output of the latest replay (which must be ``pending``)."""
        assert pending is self.latest, "logits are only kept for the latest replay"
        width = 1 if self.sample_last else pending.width
        flat = torch.tensor([r * width for r in rows], device=self.head_out.device)
        return self._logits_table().index_select(0, flat)

    def logits_span(self, pending: Pending, row: int, n: int) -> torch.Tensor:
        """[n, V]: ``row``'s logits at its first ``n`` positions, from the latest replay (which
        must be ``pending``, of a decode graph: every position is sampled)."""
        assert pending is self.latest and not self.sample_last, "spans: latest decode only"
        return self._logits_table()[row * pending.width : row * pending.width + n]

    def _logits_table(self) -> torch.Tensor:
        """The LM head's output buffer as [positions, V] (the target's rows first)."""
        return self.head_out[: self.head_out.numel() // self.vocab * self.vocab].view(
            -1, self.vocab
        )

    def hidden_rows(self, pending: Pending, rows: list[int]) -> torch.Tensor:
        """[len(rows), hidden]: each row's final hidden state at its sampled position, from the
        latest replay (which must be ``pending``, of a prefill graph)."""
        assert pending is self.latest and self.sample_last, "hidden states: latest prefill only"
        return self.hidden_out.index_select(0, torch.tensor(rows, device=self.hidden_out.device))

    def collect(self, pending: Pending) -> StepOutput:
        """The tokens of a launched step, as a :class:`StepOutput` (waits for them)."""
        rows, w = pending.rows, pending.width
        heads = self.runner.heads is not None
        best = self.tokens(pending)
        if self.sample_last:
            keep = [r.sample_from < len(r.tokens) for r in rows]
            return StepOutput(
                [[t] if k else [] for t, k in zip(best[0], keep)],
                [[[d[i] for d in best[1:]]] if k else [] for i, k in enumerate(keep)]
                if heads
                else None,
            )
        spans = [(i * w, i * w + len(r.tokens)) for i, r in enumerate(rows)]
        return StepOutput(
            [best[0][a:z] for a, z in spans],
            [[[d[p] for d in best[1:]] for p in range(a, z)] for a, z in spans] if heads else None,
        )


def feed_step(
    ids: torch.Tensor,
    pos: torch.Tensor,
    slots: torch.Tensor,
    src: torch.Tensor,
    tables: torch.Tensor,
    out: torch.Tensor,
    acc: torch.Tensor,
    block_size: int,
    use_kernels: bool,
) -> None:
    """``kernels.feed_step`` (one launch), or the same in torch ops when the kernels are off."""
    if use_kernels:
        from voicert.engine.gpu import kernels

        kernels.feed_step(ids, pos, slots, src, tables, out, acc, block_size)
        return
    _b, w = ids.shape
    fed = src[:, :1] >= 0  # [B, 1]
    j = src[:, 0].clamp(min=0)
    n = acc.index_select(0, j).unsqueeze(1)  # [B, 1]
    t = torch.arange(w, device=ids.device).clamp(max=out.shape[0] - 1).unsqueeze(0)  # [1, W]
    ids.copy_(torch.where(fed, out[t, j.unsqueeze(1) * w + n], ids))
    pos.copy_(torch.where(fed, pos - (w - 1) + n, pos))
    page = tables.gather(1, pos // block_size)
    slots.copy_(torch.where(fed, page * block_size + pos % block_size, slots))


def accept_counts(
    ids: torch.Tensor, out: torch.Tensor, acc: torch.Tensor, use_kernels: bool
) -> None:
    """``kernels.accept_counts``, or the same in torch ops when the kernels are off."""
    if use_kernels:
        from voicert.engine.gpu import kernels

        kernels.accept_counts(ids, out, acc)
        return
    b, w = ids.shape
    agree = ids[:, 1:] == out[: b * w].view(b, w)[:, :-1]  # [B, W - 1]
    acc[:b].copy_(agree.long().cumprod(1).sum(1))
