"""The engine's KV memory as numbers, and the check that every block is accounted for."""

from __future__ import annotations


def memory_stats(scheduler, swapper, block_size: int) -> dict:
    """The block manager's counts, plus swapped blocks, fragmentation and preemptions."""
    stats = scheduler.block_manager.stats().as_dict()
    allocated_slots = stats["allocated_blocks"] * block_size
    wasted = unused_tail_slots(scheduler.running, block_size)
    stats["swapped_blocks"] = swapper.num_swapped_blocks if swapper else 0
    stats["internal_fragmentation"] = wasted / allocated_slots if allocated_slots else 0.0
    stats["num_preemptions"] = scheduler.num_preemptions
    return stats


def unused_tail_slots(running, block_size: int) -> int:
    """Slots past the end of each running sequence's last block, each block counted once
    (forks share theirs), against the same physical blocks the allocation counts. The
    slot of a token sampled but not yet run through the model is in use, not waste."""
    unused: dict[int, int] = {}
    for seq in running:
        if seq.block_table:
            used = min(seq.num_tokens, len(seq.block_table) * block_size)
            unused[seq.block_table[-1]] = len(seq.block_table) * block_size - used
    return sum(unused.values())


def check_integrity(scheduler, swapper) -> None:
    """Every KV block free, cached or owned, with consistent reference counts."""
    live = scheduler.live_sequences()
    scheduler.block_manager.check_integrity(live)
    if swapper is not None:
        held = sum(len(s.swapped_blocks) for s in live)
        if held != swapper.num_swapped_blocks:
            raise AssertionError(f"{swapper.num_swapped_blocks} CPU blocks used, {held} held")
