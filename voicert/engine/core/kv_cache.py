"""KV blocks and the prefix cache: plain-Python bookkeeping (no torch), tested on the CPU.

The KV pool is ``num_blocks`` blocks of ``block_size`` token slots. Block 0 is reserved as the scratch
block padding tokens write to. A *full* block is registered under a hash that chains the previous
block's hash with its token ids, so a block can only be reused after the exact same prefix; on a hash
hit the token ids are compared too, so a collision never serves wrong KV. Blocks nobody uses but that
hold a registered prefix stay cached in LRU order and are evicted only when a fresh block is needed;
blocks in use are never evicted.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

SCRATCH_BLOCK = 0


def chain_hash(prev: int, tokens: tuple[int, ...]) -> int:
    return hash((prev, tokens))


@dataclass(slots=True)
class Block:
    id: int
    ref_count: int = 0
    hash: int | None = None  # set once the block is full and registered
    tokens: tuple[int, ...] = ()


@dataclass(slots=True)
class CacheStats:
    lookups: int = 0  # prompt tokens looked up
    hits: int = 0  # prompt tokens served from the cache

    @property
    def hit_ratio(self) -> float:
        return self.hits / self.lookups if self.lookups else 0.0


class OutOfBlocks(RuntimeError):
    pass


@dataclass(slots=True)
class SeqBlocks:
    """One sequence's view: its block ids and how many leading blocks are registered."""

    table: list[int] = field(default_factory=list)
    registered: int = 0  # blocks [0, registered) are full and hashed
    last_hash: int = -1  # hash of block registered - 1 (-1 before the first)


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 2:
            raise ValueError("need at least 2 KV blocks (block 0 is scratch)")
        self.block_size = block_size
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free: list[int] = list(range(num_blocks - 1, 0, -1))  # pop() gives low ids first
        self.cached: dict[int, int] = {}  # chain hash -> block id
        self.evictable: OrderedDict[int, None] = OrderedDict()  # unused cached blocks, LRU first
        self.stats = CacheStats()

    # ---------------------------------------------------------------- capacity

    @property
    def available(self) -> int:
        """Blocks that can be handed out now (free + evictable)."""
        return len(self.free) + len(self.evictable)

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def _take_fresh(self) -> int:
        if self.free:
            bid = self.free.pop()
        elif self.evictable:
            bid, _ = self.evictable.popitem(last=False)
            old = self.blocks[bid]
            if old.hash is not None and self.cached.get(old.hash) == bid:
                del self.cached[old.hash]
        else:
            raise OutOfBlocks("KV pool exhausted")
        b = self.blocks[bid]
        b.ref_count, b.hash, b.tokens = 1, None, ()
        return bid

    def _ref(self, bid: int) -> None:
        b = self.blocks[bid]
        if b.ref_count == 0:
            self.evictable.pop(bid, None)
        b.ref_count += 1

    # ---------------------------------------------------------------- sequences

    def match_prefix(self, tokens: list[int]) -> tuple[list[int], int]:
        """Cached blocks that start ``tokens``: (block ids, last chain hash). At most
        ``(len - 1) // block_size`` blocks, so at least one prompt token is always computed."""
        bs = self.block_size
        ids, h = [], -1
        for i in range((len(tokens) - 1) // bs):
            chunk = tuple(tokens[i * bs : (i + 1) * bs])
            nh = chain_hash(h, chunk)
            bid = self.cached.get(nh)
            if bid is None or self.blocks[bid].tokens != chunk:
                break
            ids.append(bid)
            h = nh
        return ids, h

    def allocate(self, tokens: list[int], reserve: int = 0) -> tuple[SeqBlocks, int]:
        """Blocks for a new sequence whose prompt is ``tokens`` plus ``reserve`` more slots.

        Returns (its blocks, number of leading tokens whose KV is already cached). Raises OutOfBlocks
        (taking nothing) if the pool cannot hold it."""
        hit, h = self.match_prefix(tokens)
        need = self.blocks_for(len(tokens) + reserve) - len(hit)
        evictable_hits = sum(1 for b in hit if self.blocks[b].ref_count == 0)
        if need > self.available - evictable_hits:
            raise OutOfBlocks(f"need {need} blocks, {self.available - evictable_hits} available")
        for bid in hit:
            self._ref(bid)
        seq = SeqBlocks(table=list(hit), registered=len(hit), last_hash=h)
        seq.table += [self._take_fresh() for _ in range(need)]
        self.stats.lookups += len(tokens)
        self.stats.hits += len(hit) * self.block_size
        return seq, len(hit) * self.block_size

    def can_grow(self, seq: SeqBlocks, num_tokens: int) -> bool:
        return self.blocks_for(num_tokens) - len(seq.table) <= self.available

    def grow(self, seq: SeqBlocks, num_tokens: int) -> None:
        """Make room for ``num_tokens`` slots in total. Raises OutOfBlocks."""
        need = self.blocks_for(num_tokens) - len(seq.table)
        if need > self.available:
            raise OutOfBlocks(f"need {need} blocks, {self.available} available")
        seq.table += [self._take_fresh() for _ in range(need)]

    def register_full(self, seq: SeqBlocks, tokens: list[int], num_computed: int) -> None:
        """Register every block fully covered by the first ``num_computed`` tokens (whose KV is
        final) so later requests with the same prefix can reuse it."""
        bs = self.block_size
        while (seq.registered + 1) * bs <= num_computed:
            i = seq.registered
            chunk = tuple(tokens[i * bs : (i + 1) * bs])
            h = chain_hash(seq.last_hash, chunk)
            bid = seq.table[i]
            block = self.blocks[bid]
            block.hash, block.tokens = h, chunk
            self.cached.setdefault(h, bid)
            seq.registered += 1
            seq.last_hash = h

    def free_seq(self, seq: SeqBlocks) -> None:
        """Release a finished or cancelled sequence. Registered blocks stay cached (LRU)."""
        for bid in reversed(seq.table):  # tail first: the prefix stays longest in the LRU
            b = self.blocks[bid]
            b.ref_count -= 1
            if b.ref_count > 0:
                continue
            if b.hash is not None and self.cached.get(b.hash) == bid:
                self.evictable[bid] = None
            else:
                b.hash, b.tokens = None, ()
                self.free.append(bid)
        seq.table.clear()
