"""Physical KV blocks: a free list, per-sequence block tables, reference counts, prefix cache.

With prefix caching, every full block is named by a chained hash of (parent hash, its token
ids, the request's cache key). The cache key carries the content hash of the adapter weights
the request was admitted under (never its name or int id) and the tenant, so KV is only ever
shared within one set of weights and one tenant. Freed blocks keep
their hash and stay reusable until a new block is needed; the least recently freed go first.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from dataclasses import asdict, dataclass

from loragate.engine.core.sequence import Sequence


@dataclass(frozen=True)
class MemoryStats:
    allocated_blocks: int
    free_blocks: int
    total_blocks: int
    utilization: float
    block_size: int
    cached_blocks: int
    prefix_cache_hit_rate: float
    prefix_cache_hit_tokens: int
    prefix_cache_queried_tokens: int

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class PrefixHit:
    """What a prefix-cache lookup found: cached blocks and the tokens they hold."""

    blocks: tuple[int, ...] = ()
    num_tokens: int = 0


NO_HIT = PrefixHit()


def block_hash(parent: bytes | None, token_ids: list[int], cache_key: bytes) -> bytes:
    """Content address of one full block; collisions would leak KV, so a real digest."""
    digest = hashlib.blake2b(digest_size=16)
    digest.update(parent or b"root")
    digest.update(cache_key)
    digest.update(array("q", token_ids).tobytes())
    return digest.digest()


class BlockManager:
    """Hands out fixed-size blocks. Reference counts let several sequences share one block."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        watermark: float = 0.01,
        enable_prefix_caching: bool = False,
    ):
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.ref_counts = [0] * num_blocks
        # Free blocks in eviction order: the front is the least recently freed.
        self.free_ids: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.hash_of_block: dict[int, bytes] = {}
        self.block_of_hash: dict[bytes, int] = {}
        # New prompts leave this many blocks free so running decodes are not preempted at once.
        self.watermark_blocks = int(watermark * num_blocks)
        self.hit_tokens = 0
        self.queried_tokens = 0
        self.pending_copies: list[tuple[int, int]] = []  # copy-on-write (src, dst) for the runner
        # Sequences whose block tables changed since the runner last looked: the persistent
        # batch (engine/runner/input_batch.py) rewrites their rows and no other.
        self.changed_tables: dict[int, Sequence] = {}

    # The counts vLLM code reads (`llm.llm_engine.scheduler.block_manager.num_*_blocks`),
    # computed from the free list each time, so they are always true and read-only.
    @property
    def num_free_blocks(self) -> int:
        return len(self.free_ids)

    @property
    def num_allocated_blocks(self) -> int:
        return self.num_blocks - len(self.free_ids)

    @property
    def num_total_blocks(self) -> int:
        return self.num_blocks

    def blocks_needed(
        self, seq: Sequence, num_new_tokens: int, hit: PrefixHit | None = None
    ) -> int:
        """Free blocks the next `num_new_tokens` take: new ones, a copy of a shared block
        they would write into, and the cached blocks of `hit` that sit in the free list."""
        hit = hit or NO_HIT
        revived = sum(1 for block in hit.blocks if self.ref_counts[block] == 0)
        computed = seq.num_computed_tokens + hit.num_tokens
        new = self._new_blocks(seq, computed, num_new_tokens, len(hit.blocks))
        return new + revived

    def _new_blocks(self, seq: Sequence, computed: int, num_new_tokens: int, extra=0) -> int:
        """Blocks to take for `num_new_tokens` after `computed` tokens: new ones past the
        table (and `extra` blocks about to join it), and a copy of a shared block written."""
        total = computed + num_new_tokens
        new = max(0, -(-total // self.block_size) - len(seq.block_table) - extra)
        return new + (1 if self._shared_write_block(seq, computed) is not None else 0)

    def _shared_write_block(self, seq: Sequence, computed: int) -> int | None:
        """Index in the block table of a shared block the token after `computed` ones
        would write into."""
        i = computed // self.block_size
        if i < len(seq.block_table) and self.ref_counts[seq.block_table[i]] > 1:
            return i
        return None

    # ---- prefix cache -------------------------------------------------------------------
    def lookup_prefix(self, seq: Sequence) -> PrefixHit:
        """The cached blocks of a new sequence's longest cached prefix. Looking changes
        nothing: `allocate` takes the blocks and the scheduler counts their tokens as
        computed, so a sequence refused this step needs nothing undone.

        At least the last token is always left to compute, since its logits are needed.
        """
        if not self.enable_prefix_caching or seq.block_table:
            return NO_HIT
        if seq.request.prompt_logprobs is not None:
            return NO_HIT  # every prompt token's logits are wanted: compute them all
        bs = self.block_size
        full = (seq.num_tokens - 1) // bs
        self._extend_hashes(seq, full)  # the blocks' names, memoized on the sequence
        hits = []
        for h in seq.block_hashes[:full]:
            block = self.block_of_hash.get(h)
            if block is None:
                break
            hits.append(block)
        return PrefixHit(tuple(hits), len(hits) * bs)

    def register_full_blocks(self, seq: Sequence) -> None:
        """Publish the hashes of blocks whose every token's KV is now written."""
        if not self.enable_prefix_caching:
            return
        full = min(seq.num_computed_tokens // self.block_size, len(seq.block_table))
        self._extend_hashes(seq, full)
        for i in range(full):
            block, h = seq.block_table[i], seq.block_hashes[i]
            if block not in self.hash_of_block and h not in self.block_of_hash:
                self.hash_of_block[block] = h
                self.block_of_hash[h] = block

    def _extend_hashes(self, seq: Sequence, count: int) -> None:
        bs, hashes = self.block_size, seq.block_hashes
        while len(hashes) < count:
            i = len(hashes)
            tokens = seq.token_ids[i * bs : (i + 1) * bs]
            hashes.append(block_hash(hashes[-1] if hashes else None, tokens, seq.cache_key))

    # ---- allocation ---------------------------------------------------------------------
    def can_allocate(
        self, seq: Sequence, num_new_tokens: int | None = None, hit: PrefixHit | None = None
    ) -> bool:
        """Whether a waiting sequence's next tokens (after its prefix-cache `hit`) fit,
        keeping the watermark free."""
        hit = hit or NO_HIT
        n = seq.num_uncomputed_tokens - hit.num_tokens if num_new_tokens is None else num_new_tokens
        return self.blocks_needed(seq, n, hit) <= self.num_free_blocks - self.watermark_blocks

    def allocate(
        self, seq: Sequence, num_new_tokens: int | None = None, hit: PrefixHit | None = None
    ) -> None:
        """Admit a waiting sequence: take its prefix-cache `hit` (the blocks become its
        own references, the hit rate counts it), then give it blocks for its next
        `num_new_tokens` after the hit. The sequence's computed tokens are the scheduler's
        to count (engine/core/scheduler.py)."""
        hit = hit or NO_HIT
        n = seq.num_uncomputed_tokens - hit.num_tokens if num_new_tokens is None else num_new_tokens
        if hit.blocks:
            for block in hit.blocks:
                if self.ref_counts[block] == 0:
                    del self.free_ids[block]
                self.ref_counts[block] += 1
            self.set_table(seq, list(hit.blocks))
        self.queried_tokens += seq.num_tokens
        self.hit_tokens += hit.num_tokens
        computed = seq.num_computed_tokens + hit.num_tokens
        self._grow(seq, self._new_blocks(seq, computed, n), computed)

    def can_append(self, seq: Sequence, num_new_tokens: int = 1) -> bool:
        """Whether a running sequence can add its next tokens (no watermark)."""
        return self.blocks_needed(seq, num_new_tokens) <= self.num_free_blocks

    def append_slot(self, seq: Sequence, num_new_tokens: int = 1) -> None:
        self._grow(seq, self.blocks_needed(seq, num_new_tokens), seq.num_computed_tokens)

    def trim(self, seq: Sequence, num_tokens: int) -> None:
        """Give back the blocks past the first `num_tokens` tokens of `seq` (rejected
        speculative tokens' KV): they hold nothing cached, so they are the first reused."""
        keep = -(-num_tokens // self.block_size)
        if len(seq.block_table) <= keep:
            return
        for block in reversed(seq.block_table[keep:]):
            self.ref_counts[block] -= 1
            if self.ref_counts[block] == 0:
                self.free_ids[block] = None
                self.free_ids.move_to_end(block, last=False)
        self.set_table(seq, seq.block_table[:keep])

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """The child shares every block of the parent."""
        self.set_table(child, list(parent.block_table))
        child.block_hashes = list(parent.block_hashes)
        for block in child.block_table:
            self.ref_counts[block] += 1

    def free(self, seq: Sequence) -> None:
        # Tail blocks first, so the eviction order spares shared prefixes longest.
        for block in reversed(seq.block_table):
            self.ref_counts[block] -= 1
            if self.ref_counts[block] == 0:
                self.free_ids[block] = None
        self.set_table(seq, [])

    def set_table(self, seq: Sequence, blocks: list[int]) -> None:
        """Give `seq` these blocks (references already counted) and log the change."""
        seq.block_table = blocks
        self.changed_tables[seq.seq_id] = seq

    def take_free_block(self) -> int:
        """A free block for exclusive use; a cached one loses its hash (evicted)."""
        block, _ = self.free_ids.popitem(last=False)
        h = self.hash_of_block.pop(block, None)
        if h is not None:
            del self.block_of_hash[h]
        self.ref_counts[block] = 1
        return block

    def _grow(self, seq: Sequence, count: int, computed: int) -> None:
        if count > len(self.free_ids):
            raise RuntimeError(f"out of KV blocks: need {count}, {len(self.free_ids)} free")
        shared = self._shared_write_block(seq, computed)
        if shared is not None:  # copy on write: the partly filled block is not ours alone
            old, new = seq.block_table[shared], self.take_free_block()
            self.ref_counts[old] -= 1
            seq.block_table[shared] = new
            self.pending_copies.append((old, new))
            count -= 1
        for _ in range(count):
            seq.block_table.append(self.take_free_block())
        self.changed_tables[seq.seq_id] = seq

    def take_changed_tables(self) -> dict[int, Sequence]:
        """The sequences whose tables changed since the last call (the log starts over)."""
        changed, self.changed_tables = self.changed_tables, {}
        return changed

    def take_copies(self) -> list[tuple[int, int]]:
        copies, self.pending_copies = self.pending_copies, []
        return copies

    # ---- introspection ------------------------------------------------------------------
    def stats(self) -> MemoryStats:
        free, allocated = self.num_free_blocks, self.num_allocated_blocks
        return MemoryStats(
            allocated_blocks=allocated,
            free_blocks=free,
            total_blocks=self.num_blocks,
            utilization=allocated / self.num_blocks,
            block_size=self.block_size,
            cached_blocks=len(self.hash_of_block),
            prefix_cache_hit_rate=self.hit_tokens / self.queried_tokens
            if self.queried_tokens
            else 0.0,
            prefix_cache_hit_tokens=self.hit_tokens,
            prefix_cache_queried_tokens=self.queried_tokens,
        )

    def check_integrity(self, live: list[Sequence]) -> None:
        """Every block is free, cached or owned; ref counts match the live block tables."""
        expected = [0] * self.num_blocks
        for seq in live:
            for block in seq.block_table:
                expected[block] += 1
        for block, (have, want) in enumerate(zip(self.ref_counts, expected, strict=True)):
            if have != want or (have == 0) != (block in self.free_ids):
                raise AssertionError(
                    f"block {block}: ref_count {have}, referenced {want}, "
                    f"free={block in self.free_ids}"
                )
        for h, block in self.block_of_hash.items():
            if self.hash_of_block.get(block) != h:
                raise AssertionError(f"prefix cache maps a hash to block {block} inconsistently")
        if len(self.hash_of_block) != len(self.block_of_hash):
            raise AssertionError("prefix cache hash maps disagree in size")
