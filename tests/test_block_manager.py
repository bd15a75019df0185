"""BlockManager: allocation, reference counts, chained-hash prefix caching, reuse and eviction."""
from nanovllm.engine.block_manager import BlockManager, chain_hash
from nanovllm.engine.sequence import Sequence

BS = 16


def seq_of(tokens):
    Sequence.block_size = BS
    return Sequence(list(tokens))


def fill(bm, seq):
    """Pretend the whole sequence was computed, and register its full blocks."""
    seq.num_computed_tokens = len(seq)
    bm.commit(seq)


def test_allocate_and_free_counts():
    bm = BlockManager(8, BS)
    s = seq_of(range(40))                      # 3 blocks
    assert bm.can_allocate(s)
    bm.allocate(s)
    assert len(s.block_table) == 3 and bm.num_free_blocks == 5
    assert s.num_cached_tokens == 0
    bm.deallocate(s)
    assert bm.num_free_blocks == 8 and s.block_table == []


def test_can_allocate_refuses_when_full():
    bm = BlockManager(2, BS)
    assert not bm.can_allocate(seq_of(range(33)))   # needs 3 blocks
    assert bm.can_allocate(seq_of(range(32)))


def test_chain_hash_depends_on_prefix():
    a = chain_hash(list(range(16)))
    assert chain_hash(list(range(16, 32)), a) != chain_hash(list(range(16, 32)))
    assert chain_hash(list(range(16))) == a


def test_prefix_hit_shares_blocks_and_counts_refs():
    bm = BlockManager(10, BS)
    a = seq_of(range(50))
    bm.allocate(a)
    fill(bm, a)
    b = seq_of(list(range(40)) + [999] * 10)        # shares 2 full blocks with a
    bm.allocate(b)
    assert b.block_table[:2] == a.block_table[:2]
    assert b.num_cached_tokens == b.num_computed_tokens == 32
    assert bm.blocks[a.block_table[0]].ref_count == 2
    assert b.block_table[2] != a.block_table[2]


def test_block_with_different_prefix_is_not_shared():
    bm = BlockManager(10, BS)
    a = seq_of(range(40))
    bm.allocate(a)
    fill(bm, a)
    b = seq_of([7] + list(range(1, 40)))            # first block differs, second equal
    bm.allocate(b)
    assert b.num_cached_tokens == 0
    assert set(b.block_table).isdisjoint(a.block_table)


def test_full_hit_still_computes_last_token():
    """A prompt that is entirely cached must leave its last block to compute, for its logits."""
    bm = BlockManager(10, BS)
    a = seq_of(range(48))                           # exactly 3 blocks
    bm.allocate(a)
    fill(bm, a)
    b = seq_of(range(48))
    bm.allocate(b)
    assert b.num_cached_tokens == 32 and b.num_computed_tokens < len(b)
    assert b.block_table[:2] == a.block_table[:2] and b.block_table[2] != a.block_table[2]


def test_freed_cached_blocks_are_reused_until_evicted():
    bm = BlockManager(4, BS)
    a = seq_of(range(40))                            # 3 blocks, 2 full
    bm.allocate(a)
    fill(bm, a)
    bm.deallocate(a)
    b = seq_of(range(40))
    bm.allocate(b)
    assert b.num_cached_tokens == 32               # found although a is gone
    bm.deallocate(b)
    c = seq_of(range(1000, 1064))                   # 4 blocks: every free block is recycled
    bm.allocate(c)
    fill(bm, c)
    bm.deallocate(c)
    d = seq_of(range(40))
    bm.allocate(d)
    assert d.num_cached_tokens == 0                # a's blocks were evicted


def test_eviction_takes_least_recently_freed_first():
    bm = BlockManager(4, BS)
    a, b = seq_of(range(17)), seq_of(range(100, 117))  # 2 blocks each, first full
    for s in (a, b):
        bm.allocate(s)
        fill(bm, s)
    bm.deallocate(a)
    bm.deallocate(b)
    c = seq_of(range(500, 517))                     # takes 2 blocks: a's, freed first
    bm.allocate(c)
    assert bm.can_allocate(seq_of(range(100, 117)))
    d = seq_of(range(100, 117))
    bm.allocate(d)
    assert d.num_cached_tokens == 16               # b's block survived


def test_append_allocates_only_at_block_boundary():
    bm = BlockManager(4, BS)
    s = seq_of(range(16))
    bm.allocate(s)
    s.num_computed_tokens = 16
    s.append_token(1)                               # token 16 needs block 2
    assert bm.try_append(s)
    assert len(s.block_table) == 2
    s.append_token(2)
    assert bm.try_append(s)
    assert len(s.block_table) == 2


def test_append_takes_nothing_when_the_pool_is_short():
    bm = BlockManager(2, BS)
    s, t = seq_of(range(16)), seq_of(range(100, 116))
    bm.allocate(s)
    bm.allocate(t)
    s.num_computed_tokens = 16
    s.append_token(1)                               # token 16 needs a third block: none is free
    assert not bm.try_append(s)
    assert len(s.block_table) == 1 and bm.num_free_blocks == 0


def test_decode_blocks_are_registered_once_full():
    bm = BlockManager(8, BS)
    s = seq_of(range(10))
    bm.allocate(s)
    for t in range(6):
        s.append_token(t)
    fill(bm, s)                                    # 16 tokens computed
    assert bm.blocks[s.block_table[0]].hash == chain_hash(s.token_ids[:16])


def test_disabled_prefix_caching_never_hits():
    bm = BlockManager(10, BS, enable_prefix_caching=False)
    a = seq_of(range(40))
    bm.allocate(a)
    fill(bm, a)
    b = seq_of(range(40))
    bm.allocate(b)
    assert b.num_cached_tokens == 0


def test_reset_prefix_cache_forgets_blocks_only_when_all_are_free():
    bm = BlockManager(10, BS)
    a = seq_of(range(50))
    bm.allocate(a)
    fill(bm, a)
    assert not bm.reset_prefix_cache()           # a still holds its blocks
    bm.deallocate(a)
    assert bm.reset_prefix_cache()
    b = seq_of(range(50))
    bm.allocate(b)
    assert b.num_cached_tokens == 0 and bm.hash_to_block_id == {}
