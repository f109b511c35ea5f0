"""Block manager: allocation arithmetic, reference counts, stats, integrity check."""

from __future__ import annotations

import pytest

from loragate.engine.core.block_manager import BlockManager
from loragate.engine.core.sequence import Request, Sequence
from loragate.engine.sampling.sampling_params import SamplingParams


def make_seq(n_tokens: int, seq_id: int = 0) -> Sequence:
    request = Request(f"r{seq_id}", None, list(range(n_tokens)), SamplingParams(max_tokens=8))
    return Sequence(seq_id, request, 0, None)


def test_allocate_rounds_up_to_whole_blocks():
    bm = BlockManager(num_blocks=10, block_size=16, watermark=0)
    seq = make_seq(17)
    assert bm.blocks_needed(seq, 17) == 2
    assert bm.can_allocate(seq)
    bm.allocate(seq)
    assert len(seq.block_table) == 2
    assert bm.stats().allocated_blocks == 2 and bm.stats().free_blocks == 8
    assert bm.stats().utilization == pytest.approx(0.2)


def test_append_slot_adds_a_block_only_at_a_boundary():
    bm = BlockManager(num_blocks=4, block_size=4, watermark=0)
    seq = make_seq(4)
    bm.allocate(seq)
    seq.num_computed_tokens = 4
    assert bm.blocks_needed(seq, 1) == 1
    bm.append_slot(seq)
    seq.num_computed_tokens = 5
    assert len(seq.block_table) == 2
    assert bm.blocks_needed(seq, 1) == 0


def test_cannot_allocate_beyond_free_blocks_or_watermark():
    bm = BlockManager(num_blocks=100, block_size=16, watermark=0.05)
    seq = make_seq(16 * 96)
    assert not bm.can_allocate(seq)  # 96 needed, 100 free, 5 kept back
    assert bm.can_append(seq, 16 * 96)  # running sequences may use the watermark
    with pytest.raises(RuntimeError, match="out of KV blocks"):
        bm.append_slot(seq, 16 * 101)


def test_fork_shares_blocks_and_free_releases_only_unreferenced():
    bm = BlockManager(num_blocks=8, block_size=4, watermark=0)
    parent, child = make_seq(8, 0), make_seq(8, 1)
    bm.allocate(parent)
    bm.fork(parent, child)
    assert child.block_table == parent.block_table
    assert all(bm.ref_counts[b] == 2 for b in parent.block_table)
    bm.check_integrity([parent, child])
    bm.free(parent)
    assert bm.stats().allocated_blocks == 2
    bm.check_integrity([child])
    bm.free(child)
    assert bm.stats().free_blocks == 8
    bm.check_integrity([])


def test_integrity_check_catches_a_leak():
    bm = BlockManager(num_blocks=4, block_size=4, watermark=0)
    seq = make_seq(4)
    bm.allocate(seq)
    with pytest.raises(AssertionError, match="ref_count 1, referenced 0"):
        bm.check_integrity([])


def test_a_prefix_lookup_changes_nothing_and_allocate_commits_it():
    """vLLM V1's split: looking up the prefix cache takes no block and advances nothing, so a
    sequence the scheduler then refuses needs nothing undone; `allocate` takes its blocks."""
    bm = BlockManager(num_blocks=8, block_size=4, watermark=0, enable_prefix_caching=True)
    first = make_seq(10, 0)
    bm.allocate(first)
    first.num_computed_tokens = 10
    bm.register_full_blocks(first)  # blocks 0 and 1 are full and named
    cached = first.block_table[:2]
    bm.free(first)  # cached blocks stay named in the free list

    again = make_seq(10, 1)
    state = (list(bm.ref_counts), list(bm.free_ids), bm.stats())
    hit = bm.lookup_prefix(again)
    assert hit.blocks == tuple(cached) and hit.num_tokens == 8
    assert (list(bm.ref_counts), list(bm.free_ids), bm.stats()) == state
    assert again.num_computed_tokens == 0 and again.block_table == []

    # The two cached blocks come back out of the free list, plus one new block.
    assert bm.blocks_needed(again, 2, hit) == 3
    bm.allocate(again, 2, hit)
    assert again.block_table[:2] == cached and len(again.block_table) == 3
    # The hit's tokens are the scheduler's to count as computed (engine/core/scheduler.py).
    assert again.num_computed_tokens == 0
    assert bm.stats().prefix_cache_hit_tokens == 8
    bm.check_integrity([again])
