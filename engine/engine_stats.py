"""The engine's KV memory as numbers, and the check that every block is accounted for."""

from __future__ import annotations

from loragate.engine.engine_info import EngineStats


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


def snapshot(engine) -> EngineStats:
    """One consistent read of an engine's counters (run on the engine thread)."""
    scheduler = engine.scheduler
    busy = frozenset(s.lora_request.lora_name for s in scheduler.running if s.lora_slot >= 0)
    waiting = frozenset(s.lora_request.lora_name for s in scheduler.waiting if s.lora_request)
    return EngineStats(
        unfinished_requests=len(engine.requests),
        running=len(scheduler.running),
        waiting=len(scheduler.waiting),
        memory=dict(engine.get_memory_stats()),
        prompt_tokens=engine.num_prompt_tokens,
        generation_tokens=engine.num_generation_tokens,
        preemptions=scheduler.num_preemptions,
        adapters=dict(engine.adapters.stats()) if engine.adapters is not None else {},
        busy_adapters=busy,
        waiting_adapters=waiting,
        adapter_tiers=engine.adapters.tiers() if engine.adapters is not None else {},
        adapter_loads=engine.adapters.loads() if engine.adapters is not None else {},
        tenant_service=dict(engine.fair_share.served),
        tenant_virtual_service={k: t["service"] for k, t in engine.fair_share.tenants().items()},
    )
