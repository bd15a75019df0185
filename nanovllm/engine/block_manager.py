"""Paged KV cache bookkeeping: a pool of fixed-size blocks, reference counts, and a prefix cache.

A full block is identified by a chained hash: hash(parent block's hash, this block's token ids), so two
sequences share a block only when every token before it is equal too. Blocks are registered in the
cache when the step that writes their K/V is scheduled (a request later in the same step may share them:
every layer stores the step's K/V before its attention reads them). A freed block keeps its hash and
stays findable until the pool hands it out again (least recently freed first): that is the eviction.
"""
import numpy as np
import xxhash

from nanovllm.engine.sequence import Sequence


def chain_hash(token_ids: list[int], parent: int = -1) -> int:
    h = xxhash.xxh64()
    if parent != -1:
        h.update(parent.to_bytes(8, "little"))
    h.update(np.asarray(token_ids, dtype=np.int64).tobytes())
    return h.intdigest()


class Block:
    """One KV block: who uses it and, once full and written, which tokens it holds."""

    def __init__(self, block_id: int):
        self.block_id = block_id
        self.ref_count = 0
        self.hash = -1
        self.token_ids: list[int] = []


class BlockManager:
    """Allocates KV blocks to sequences and finds shared prefixes."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.hash_to_block_id: dict[int, int] = {}
        self.free_block_ids: dict[int, None] = dict.fromkeys(range(num_blocks))  # ordered: oldest first
        self.num_hashed_blocks: dict[int, int] = {}   # seq_id -> blocks of that seq already registered

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_block_ids)

    def _evict(self, block: Block) -> None:
        if block.hash != -1 and self.hash_to_block_id.get(block.hash) == block.block_id:
            del self.hash_to_block_id[block.hash]
        block.hash, block.token_ids = -1, []

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block (as vLLM's reset_prefix_cache); refused (False) while blocks are in use."""
        if self.num_free_blocks != len(self.blocks):
            return False
        for block in self.blocks:
            self._evict(block)
        return True

    def _lookup(self, seq: Sequence) -> list[int]:
        """Block ids of the longest cached prefix. The block holding the last token is never taken from
        the cache, so that token is always computed and yields logits."""
        if not self.enable_prefix_caching or seq.sampling_params.prompt_logprobs is not None:
            return []   # prompt logprobs need every prompt position computed
        hits, parent = [], -1
        for i in range((len(seq) - 1) // self.block_size):
            token_ids = seq.block(i)
            h = chain_hash(token_ids, parent)
            block_id = self.hash_to_block_id.get(h, -1)
            if block_id == -1 or self.blocks[block_id].token_ids != token_ids:
                break
            hits.append(block_id)
            parent = h
        return hits

    def can_allocate(self, seq: Sequence) -> bool:
        hits = self._lookup(seq)
        return seq.num_blocks - sum(self.blocks[b].ref_count > 0 for b in hits) <= self.num_free_blocks

    def allocate(self, seq: Sequence) -> bool:
        """Give `seq` blocks for all its tokens, reusing cached prefix blocks; False, with nothing taken,
        when the pool has too few free blocks (one prefix lookup decides and allocates)."""
        assert not seq.block_table
        hits = self._lookup(seq)
        if seq.num_blocks - sum(self.blocks[b].ref_count > 0 for b in hits) > self.num_free_blocks:
            return False
        for block_id in hits:
            block = self.blocks[block_id]
            if block.ref_count == 0:
                del self.free_block_ids[block_id]
            block.ref_count += 1
        seq.block_table = hits + [self._fresh_block() for _ in range(seq.num_blocks - len(hits))]
        seq.num_cached_tokens = seq.num_computed_tokens = len(hits) * self.block_size
        self.num_hashed_blocks[seq.seq_id] = len(hits)
        return True

    def _fresh_block(self) -> int:
        block_id = next(iter(self.free_block_ids))
        del self.free_block_ids[block_id]
        block = self.blocks[block_id]
        self._evict(block)
        block.ref_count = 1
        return block_id

    def deallocate(self, seq: Sequence) -> None:
        """Drop `seq`'s references; blocks nobody uses go back to the pool, still findable by hash."""
        for block_id in reversed(seq.block_table):
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                self.free_block_ids[block_id] = None
        seq.block_table = []
        seq.num_computed_tokens = 0
        self.num_hashed_blocks.pop(seq.seq_id, None)

    def try_append(self, seq: Sequence) -> bool:
        """Make room for the K/V of the tokens up to position len(seq) - 1 (the last one, or drafts too);
        False, with nothing taken, when the pool has too few free blocks. Short of blocks in one step of
        block_size (or when drafts cross a block end)."""
        short = -(-len(seq.token_ids) // self.block_size) - len(seq.block_table)
        if short <= 0:
            return True
        if short > len(self.free_block_ids):
            return False
        for _ in range(short):
            seq.block_table.append(self._fresh_block())
        return True

    def commit(self, seq: Sequence, num_tokens: int | None = None) -> None:
        """Register every block that the first num_tokens tokens (by default the computed ones) fill, so
        later requests can share it. The scheduler commits a chunk's blocks when it schedules the chunk:
        a request behind it in the same step then reads them too, since each layer stores the step's K/V
        before its attention reads any (so n samples of one prompt compute the prompt once)."""
        if not self.enable_prefix_caching:
            return
        done = self.num_hashed_blocks.get(seq.seq_id, 0)
        num_tokens = seq.num_computed_tokens if num_tokens is None else num_tokens
        num_full = min(num_tokens // self.block_size, len(seq.block_table))
        if num_full <= done:
            return
        parent = self.blocks[seq.block_table[done - 1]].hash if done else -1
        for i in range(done, num_full):
            block = self.blocks[seq.block_table[i]]
            token_ids = seq.block(i)
            parent = chain_hash(token_ids, parent)
            block.hash, block.token_ids = parent, token_ids
            self.hash_to_block_id[parent] = block.block_id
        self.num_hashed_blocks[seq.seq_id] = max(done, num_full)

    def forget_unwritten(self, seq: Sequence) -> None:
        """Unregister the blocks committed for a step that never ran (an aborted call): past the sequence's
        computed tokens, their K/V may not have been written."""
        written = seq.num_computed_tokens // self.block_size
        for i in range(written, self.num_hashed_blocks.get(seq.seq_id, 0)):
            self._evict(self.blocks[seq.block_table[i]])
        if seq.seq_id in self.num_hashed_blocks:
            self.num_hashed_blocks[seq.seq_id] = min(written, self.num_hashed_blocks[seq.seq_id])
