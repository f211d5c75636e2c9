"""The model runner: owns the model and every tensor (the KV pool), turns a scheduler Step into one
padded forward, and hands back greedy tokens. The only host sync per step is the final ``tolist``."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from voicert.engine.kv_cache import SCRATCH_BLOCK
from voicert.engine.models.llama import AttnInputs, LlamaModel
from voicert.engine.scheduler import Step


@dataclass(slots=True)
class Row:
    tokens: list[int]  # the tokens this row feeds
    start: int  # absolute position of tokens[0]
    table: list[int]  # the sequence's block ids
    sample_from: int  # logits from this row index onwards are sampled (len(tokens): none)


def rows_for(step: Step) -> list[Row]:
    if step.kind == "prefill":
        return [Row(c.seq.tokens[c.start:c.end], c.start, c.seq.blocks.table,
                    (c.end - c.start - 1) if c.samples else (c.end - c.start)) for c in step.chunks]
    return [Row([s.tokens[-1], *s.draft], len(s.tokens) - 1, s.blocks.table, 0) for s in step.seqs]


BATCH_LADDER = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)
SPAN_LADDER = (256, 512, 1024, 2048, 4096, 8192)  # attended key span (tokens) per graph


def bucket(value: int, ladder: list[int]) -> int | None:
    """The smallest ladder entry >= value, or None."""
    return next((x for x in ladder if x >= value), None)


class ModelRunner:
    def __init__(self, model: LlamaModel, num_blocks: int, block_size: int,
                 cuda_graphs: bool = False, max_batch: int = 64, max_context: int = 2048) -> None:
        cfg = model.cfg
        self.model = model
        self.block_size = block_size
        self.num_blocks = num_blocks
        p = next(model.parameters())
        self.device, self.dtype = p.device, p.dtype
        shape = (cfg.num_layers, num_blocks, block_size, cfg.num_kv_heads, cfg.head_dim)
        self.k_pool = torch.zeros(shape, dtype=self.dtype, device=self.device)  # [layers, NB, BS, KVH, D]
        self.v_pool = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self.graphs = (DecodeGraphs(self, max_batch, max_context)
                       if cuda_graphs and self.device.type == "cuda" else None)

    @staticmethod
    def kv_bytes_per_block(model: LlamaModel, block_size: int, dtype: torch.dtype) -> int:
        cfg = model.cfg
        elem = torch.tensor([], dtype=dtype).element_size()
        return 2 * cfg.num_layers * block_size * cfg.num_kv_heads * cfg.head_dim * elem

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
        mb = max(-(-(r.start + len(r.tokens)) // self.block_size) for r in rows)
        ids, pos, slots, tables = self.layout(rows, len(rows), mb, q)
        dev = self.device
        inp = AttnInputs(positions=torch.tensor(pos, device=dev),  # [B, Q]
                         slots=torch.tensor(slots, device=dev).view(-1),  # [B*Q]
                         block_tables=torch.tensor(tables, device=dev))  # [B, MB]
        return torch.tensor(ids, device=dev), inp

    @torch.inference_mode()
    def run(self, step: Step) -> list[list[int]]:
        """One forward for the step. Returns, per row, the greedy token after each sampled
        position (prefill rows that finish their prompt: one; decode rows: len(draft) + 1)."""
        rows = rows_for(step)
        if self.graphs is not None and step.kind == "decode" and all(len(r.tokens) == 1 for r in rows):
            out = self.graphs.run(rows)
            if out is not None:
                return out
        input_ids, inp = self.prepare(rows)
        hidden = self.model(input_ids, inp, self.k_pool, self.v_pool)  # [B, Q, hidden]
        picks = [(i, j) for i, r in enumerate(rows) for j in range(r.sample_from, len(r.tokens))]
        if not picks:
            return [[] for _ in rows]
        bi = torch.tensor([i for i, _ in picks], device=self.device)
        qi = torch.tensor([j for _, j in picks], device=self.device)
        tokens = self.model.logits(hidden[bi, qi]).argmax(-1).tolist()  # [P]; the one host sync
        out: list[list[int]] = [[] for _ in rows]
        for (i, _), t in zip(picks, tokens):
            out[i].append(t)
        return out


class DecodeGraphs:
    """CUDA graphs of one greedy decode step (Q = 1) over a ladder of batch sizes and key spans.

    Inputs live in static device buffers, staged through pinned host buffers and copied without
    blocking; the graph computes the mask, the forward, the logits and the argmax, so one replay
    plus one ``tolist`` is the whole step."""

    def __init__(self, runner: ModelRunner, max_batch: int, max_context: int) -> None:
        self.runner = runner
        bs = runner.block_size
        self.batches = [b for b in BATCH_LADDER if b < max_batch] + [max_batch]
        spans = [s for s in SPAN_LADDER if s < max_context] + [max_context]
        self.blocks = sorted({-(-s // bs) for s in spans})
        mb, mbk = self.batches[-1], self.blocks[-1]
        dev = runner.device
        # device buffers the graphs read: ids [MB,1], pos [MB,1], slots [MB], tables [MB, MBK]
        self.ids = torch.zeros(mb, 1, dtype=torch.long, device=dev)
        self.pos = torch.zeros(mb, 1, dtype=torch.long, device=dev)
        self.slots = torch.zeros(mb, dtype=torch.long, device=dev)
        self.tables = torch.zeros(mb, mbk, dtype=torch.long, device=dev)
        self.out = torch.zeros(mb, dtype=torch.long, device=dev)
        self.host = {name: torch.zeros(t.shape, dtype=torch.long).pin_memory()
                     for name, t in (("ids", self.ids), ("pos", self.pos), ("slots", self.slots),
                                     ("tables", self.tables))}
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self._capture()

    @torch.inference_mode()
    def _capture(self) -> None:
        model, r = self.runner.model, self.runner
        pool = torch.cuda.graph_pool_handle()
        for b in reversed(self.batches):
            for nblk in reversed(self.blocks):
                inp = AttnInputs(self.pos[:b], self.slots[:b], self.tables[:b, :nblk])
                stream = torch.cuda.Stream()
                stream.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(stream):  # warm up kernels / autotuning outside the graph
                    for _ in range(2):
                        h = model(self.ids[:b], inp, r.k_pool, r.v_pool)
                        self.out[:b] = model.logits(h[:, -1]).argmax(-1)
                torch.cuda.current_stream().wait_stream(stream)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    h = model(self.ids[:b], inp, r.k_pool, r.v_pool)
                    self.out[:b] = model.logits(h[:, -1]).argmax(-1)
                self.graphs[(b, nblk)] = graph
        torch.cuda.synchronize()

    def run(self, rows: list[Row]) -> list[list[int]] | None:
        """Replay the smallest graph that fits; None when none does (the caller runs eagerly)."""
        n = len(rows)
        need = max(-(-(r.start + 1) // self.runner.block_size) for r in rows)
        b, nblk = bucket(n, self.batches), bucket(need, self.blocks)
        if b is None or nblk is None:
            return None
        ids, pos, slots, tables = self.runner.layout(rows, b, nblk, 1)
        h = self.host
        h["ids"][:b] = torch.tensor(ids)
        h["pos"][:b] = torch.tensor(pos)
        h["slots"][:b] = torch.tensor(slots).view(-1)
        h["tables"][:b, :nblk] = torch.tensor(tables)
        self.ids[:b].copy_(h["ids"][:b], non_blocking=True)
        self.pos[:b].copy_(h["pos"][:b], non_blocking=True)
        self.slots[:b].copy_(h["slots"][:b], non_blocking=True)
        self.tables[:b, :nblk].copy_(h["tables"][:b, :nblk], non_blocking=True)
        self.graphs[(b, nblk)].replay()
        return [[t] for t in self.out[:n].tolist()]  # the one host sync of the step
