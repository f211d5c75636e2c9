import pytest

from voicert.engine.core.kv_cache import SCRATCH_BLOCK, BlockManager, OutOfBlocks


def test_allocate_reserves_blocks_and_never_hands_out_scratch():
    bm = BlockManager(8, 4)
    seq, cached = bm.allocate(list(range(10)), reserve=1)
    assert cached == 0 and len(seq.table) == 3 and SCRATCH_BLOCK not in seq.table
    assert bm.available == 4


def test_prefix_hit_after_register_and_free():
    bm = BlockManager(16, 4)
    prompt = list(range(13))
    a, _ = bm.allocate(prompt, reserve=1)
    bm.register_full(a, prompt, 13)
    assert a.registered == 3
    bm.free_seq(a)
    _b, cached = bm.allocate([*prompt[:12], 99, 100], reserve=1)
    assert cached == 12  # three full blocks reused
    assert bm.stats.hits == 12 and bm.stats.lookups == 27


def test_at_least_one_token_is_always_computed():
    bm = BlockManager(16, 4)
    prompt = list(range(8))
    a, _ = bm.allocate(prompt)
    bm.register_full(a, prompt, 8)
    bm.free_seq(a)
    _, cached = bm.allocate(prompt)
    assert cached == 4  # the second block holds the last token: recomputed, not shared


def test_chain_hash_reuses_only_identical_prefixes():
    bm = BlockManager(16, 4)
    a, _ = bm.allocate([1, 2, 3, 4, 5, 6, 7, 8, 9])
    bm.register_full(a, [1, 2, 3, 4, 5, 6, 7, 8, 9], 9)
    # same second block, different first block: no reuse at all
    _, cached = bm.allocate([0, 2, 3, 4, 5, 6, 7, 8, 9])
    assert cached == 0


def test_hash_collision_falls_back_to_token_compare(monkeypatch):
    import voicert.engine.core.kv_cache as kv

    monkeypatch.setattr(kv, "chain_hash", lambda prev, toks: 7)  # everything collides
    bm = BlockManager(16, 4)
    a, _ = bm.allocate([1, 2, 3, 4, 5])
    bm.register_full(a, [1, 2, 3, 4, 5], 5)
    _, cached = bm.allocate([9, 9, 9, 9, 5])
    assert cached == 0


def test_shared_blocks_are_ref_counted_and_in_use_blocks_never_evicted():
    bm = BlockManager(6, 4)  # 5 usable
    p = list(range(9))
    a, _ = bm.allocate(p)
    bm.register_full(a, p, 9)
    b, cached = bm.allocate(p)
    assert cached == 8 and b.table[:2] == a.table[:2]
    assert bm.blocks[a.table[0]].ref_count == 2
    bm.free_seq(a)
    assert bm.blocks[b.table[0]].ref_count == 1
    with pytest.raises(OutOfBlocks):
        bm.allocate(list(range(100, 120)))  # 5 blocks needed, only the evictable/free ones count
    assert bm.blocks[b.table[0]].ref_count == 1 and bm.cached


def test_lru_evicts_unused_cached_blocks_oldest_first():
    bm = BlockManager(5, 2)  # 4 usable
    old = [1, 2, 3]
    a, _ = bm.allocate(old)
    bm.register_full(a, old, 3)
    bm.free_seq(a)
    new = [7, 8, 9]
    b, _ = bm.allocate(new)
    bm.register_full(b, new, 3)
    bm.free_seq(b)
    c, _ = bm.allocate([5, 5, 5, 5, 5])  # 3 blocks: takes the 2 free and 1 evictable block
    assert bm.match_prefix([*new, 0])[0]  # the newer prefix survives
    assert not bm.match_prefix([*old, 0])[0]  # the older one was evicted
    bm.free_seq(c)


def test_failed_allocation_takes_nothing():
    bm = BlockManager(4, 4)
    before = bm.available
    with pytest.raises(OutOfBlocks):
        bm.allocate(list(range(40)))
    assert bm.available == before
