"""Physical KV blocks: a free list, per-sequence block tables and reference counts."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from loragate.engine.sequence import Sequence


@dataclass(frozen=True)
class MemoryStats:
    allocated_blocks: int
    free_blocks: int
    total_blocks: int
    utilization: float
    block_size: int

    def as_dict(self) -> dict:
        return {
            "allocated_blocks": self.allocated_blocks,
            "free_blocks": self.free_blocks,
            "total_blocks": self.total_blocks,
            "utilization": self.utilization,
            "block_size": self.block_size,
        }


class BlockManager:
    """Hands out fixed-size blocks. Reference counts let several sequences share one block."""

    def __init__(self, num_blocks: int, block_size: int, watermark: float = 0.01):
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.ref_counts = [0] * num_blocks
        self.free_ids: deque[int] = deque(range(num_blocks))
        # New prompts leave this many blocks free so running decodes are not preempted at once.
        self.watermark_blocks = int(watermark * num_blocks)

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_ids)

    def blocks_needed(self, seq: Sequence, num_new_tokens: int) -> int:
        total = seq.num_computed_tokens + num_new_tokens
        return max(0, -(-total // self.block_size) - len(seq.block_table))

    def can_allocate(self, seq: Sequence, num_new_tokens: int | None = None) -> bool:
        """Whether a waiting sequence's next tokens fit, keeping the watermark free."""
        n = seq.num_uncomputed_tokens if num_new_tokens is None else num_new_tokens
        return self.blocks_needed(seq, n) <= self.num_free_blocks - self.watermark_blocks

    def allocate(self, seq: Sequence, num_new_tokens: int | None = None) -> None:
        n = seq.num_uncomputed_tokens if num_new_tokens is None else num_new_tokens
        self._grow(seq, self.blocks_needed(seq, n))

    def can_append(self, seq: Sequence, num_new_tokens: int = 1) -> bool:
        """Whether a running sequence can add its next tokens (no watermark)."""
        return self.blocks_needed(seq, num_new_tokens) <= self.num_free_blocks

    def append_slot(self, seq: Sequence, num_new_tokens: int = 1) -> None:
        self._grow(seq, self.blocks_needed(seq, num_new_tokens))

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """The child shares every block of the parent."""
        child.block_table = list(parent.block_table)
        for block in child.block_table:
            self.ref_counts[block] += 1

    def free(self, seq: Sequence) -> None:
        for block in seq.block_table:
            self.ref_counts[block] -= 1
            if self.ref_counts[block] == 0:
                self.free_ids.append(block)
        seq.block_table = []

    def _grow(self, seq: Sequence, count: int) -> None:
        if count > len(self.free_ids):
            raise RuntimeError(f"out of KV blocks: need {count}, {len(self.free_ids)} free")
        for _ in range(count):
            block = self.free_ids.popleft()
            self.ref_counts[block] = 1
            seq.block_table.append(block)

    def stats(self) -> MemoryStats:
        free = self.num_free_blocks
        allocated = self.num_blocks - free
        return MemoryStats(
            allocated_blocks=allocated,
            free_blocks=free,
            total_blocks=self.num_blocks,
            utilization=allocated / self.num_blocks,
            block_size=self.block_size,
        )

    def check_integrity(self, live: list[Sequence]) -> None:
        """Every block is free xor referenced exactly as often as live block tables say."""
        expected = [0] * self.num_blocks
        for seq in live:
            for block in seq.block_table:
                expected[block] += 1
        free = set(self.free_ids)
        if len(free) != len(self.free_ids):
            raise AssertionError("a block is on the free list twice")
        for block, (have, want) in enumerate(zip(self.ref_counts, expected, strict=True)):
            if have != want or (have == 0) != (block in free):
                raise AssertionError(
                    f"block {block}: ref_count {have}, referenced {want}, free={block in free}"
                )
