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


class ModelRunner:
    def __init__(self, model: LlamaModel, num_blocks: int, block_size: int) -> None:
        cfg = model.cfg
        self.model = model
        self.block_size = block_size
        self.num_blocks = num_blocks
        p = next(model.parameters())
        self.device, self.dtype = p.device, p.dtype
        shape = (cfg.num_layers, num_blocks, block_size, cfg.num_kv_heads, cfg.head_dim)
        self.k_pool = torch.zeros(shape, dtype=self.dtype, device=self.device)  # [layers, NB, BS, KVH, D]
        self.v_pool = torch.zeros(shape, dtype=self.dtype, device=self.device)

    @staticmethod
    def kv_bytes_per_block(model: LlamaModel, block_size: int, dtype: torch.dtype) -> int:
        cfg = model.cfg
        elem = torch.tensor([], dtype=dtype).element_size()
        return 2 * cfg.num_layers * block_size * cfg.num_kv_heads * cfg.head_dim * elem

    def prepare(self, rows: list[Row]) -> tuple[torch.Tensor, AttnInputs]:
        bs = self.block_size
        b = len(rows)
        q = max(len(r.tokens) for r in rows)
        mb = max(-(-(r.start + len(r.tokens)) // bs) for r in rows)
        ids = [[0] * q for _ in range(b)]
        pos = [[0] * q for _ in range(b)]
        slots = [[SCRATCH_BLOCK * bs] * q for _ in range(b)]
        tables = [[SCRATCH_BLOCK] * mb for _ in range(b)]
        for i, r in enumerate(rows):
            n = len(r.tokens)
            ids[i][:n] = r.tokens
            pos[i][:n] = range(r.start, r.start + n)
            slots[i][:n] = [r.table[p // bs] * bs + p % bs for p in range(r.start, r.start + n)]
            used = -(-(r.start + n) // bs)
            tables[i][:used] = r.table[:used]
        dev = self.device
        positions = torch.tensor(pos, device=dev)  # [B, Q]
        keys = torch.arange(mb * bs, device=dev)  # [L]
        mask = (keys.view(1, 1, -1) <= positions.unsqueeze(-1)).unsqueeze(1)  # [B, 1, Q, L]
        inp = AttnInputs(positions=positions, slots=torch.tensor(slots, device=dev).view(-1),
                         block_tables=torch.tensor(tables, device=dev), mask=mask)
        return torch.tensor(ids, device=dev), inp

    @torch.inference_mode()
    def run(self, step: Step) -> list[list[int]]:
        """One forward for the step. Returns, per row, the greedy token after each sampled
        position (prefill rows that finish their prompt: one; decode rows: len(draft) + 1)."""
        rows = rows_for(step)
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
