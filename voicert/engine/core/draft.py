"""Draft-model speculation: a smaller model with the same tokenizer proposes k greedy tokens per
sequence; the target verifies them in one forward (see ``speculative.accept_greedy``), so the output
is exactly the target's greedy output whatever the draft says.

The draft keeps its own KV pool and block manager (with its own prefix cache). Per sequence it
remembers how many tokens its KV covers; each step first catches up on the tokens the target
accepted since (at most k + 1), then drafts k tokens one batched step at a time.
"""

from __future__ import annotations

from dataclasses import dataclass

from voicert.engine.core.kv_cache import BlockManager, OutOfBlocks, SeqBlocks
from voicert.engine.core.runner import ModelRunner, Row
from voicert.engine.core.sequence import Sequence
from voicert.engine.models.base import Model


@dataclass(slots=True)
class DraftState:
    blocks: SeqBlocks
    computed: int  # leading tokens whose draft KV is valid


class DraftModelProposer:
    def __init__(
        self, model: Model, num_blocks: int, block_size: int, torchscript: bool = False
    ) -> None:
        self.runner = ModelRunner(model, num_blocks, block_size, torchscript=torchscript)
        self.blocks = BlockManager(num_blocks, block_size)
        self.state: dict[str, DraftState] = {}

    def _prepare(self, seq: Sequence, k: int) -> DraftState | None:
        """Blocks for the sequence's tokens plus k drafts; None if the draft pool is full."""
        st = self.state.get(seq.id)
        try:
            if st is None:
                blocks, cached = self.blocks.allocate(seq.tokens, reserve=k)
                st = self.state[seq.id] = DraftState(blocks, cached)
            else:
                self.blocks.grow(st.blocks, len(seq.tokens) + k)
        except OutOfBlocks:
            self.release(seq.id)
            return None
        return st

    def propose(self, seqs: list[Sequence], k: int) -> None:
        """Set ``seq.draft`` (at most min(k, remaining - 1) tokens) for every sequence."""
        live: list[tuple[Sequence, DraftState, int]] = []
        for seq in seqs:
            n = max(min(k, seq.remaining - 1), 0)
            seq.draft = []
            st = self._prepare(seq, n) if n else None
            if st is not None:
                live.append((seq, st, n))
        if not live:
            return
        # catch up on everything the draft has not seen; the last position gives draft token 1
        rows = [
            Row(
                seq.tokens[st.computed :],
                st.computed,
                st.blocks.table,
                len(seq.tokens) - st.computed - 1,
            )
            for seq, st, _ in live
        ]
        firsts = self.runner.run_rows(rows)
        for (seq, st, _), out in zip(live, firsts):
            st.computed = len(seq.tokens)
            self.blocks.register_full(st.blocks, seq.tokens, st.computed)
            seq.draft = out[:1]
        for step in range(1, k):
            active = [(seq, st) for seq, st, n in live if step < n]
            if not active:
                break
            rows = [
                Row([seq.draft[-1]], len(seq.tokens) + step - 1, st.blocks.table, 0)
                for seq, st in active
            ]
            for (seq, _), out in zip(active, self.runner.run_rows(rows)):
                seq.draft.append(out[0])
        # KV written for the drafts is not trusted: the next catch-up starts at len(tokens)

    def release(self, request_id: str) -> None:
        st = self.state.pop(request_id, None)
        if st is not None:
            self.blocks.free_seq(st.blocks)
