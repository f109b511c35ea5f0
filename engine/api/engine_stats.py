"""The engine's state as numbers for metrics: one EngineStats snapshot (queues, KV blocks,
adapter residency, token counters), copied on the engine thread so a caller never reads
engine state while a step changes it; and the check that every KV block is accounted for."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class EngineStats:
    """Queues, KV blocks (as `LLMEngine.get_memory_stats`) and adapter residency (as
    `AdapterResidency.counts`; empty with LoRA off), with the engine's token counters."""

    unfinished_requests: int = 0
    running: int = 0
    waiting: int = 0
    memory: dict = field(default_factory=dict)
    prompt_tokens: int = 0
    generation_tokens: int = 0
    preemptions: int = 0
    adapters: dict = field(default_factory=dict)
    busy_adapters: frozenset[str] = frozenset()
    # Adapter names of the sequences waiting for their first step (vllm:lora_requests_info).
    waiting_adapters: frozenset[str] = frozenset()
    # Weights in memory by sha256: "device" (a slot) or "cpu"; any other adapter is on disk.
    adapter_tiers: dict = field(default_factory=dict)
    # sha256 -> (disk loads, their seconds, device slot loads, their seconds)
    adapter_loads: dict = field(default_factory=dict)
    # Fair shares (engine/core/fair_share.py), by tenant (else "adapter:<name>", else "base"):
    # weighted tokens received since start, and the virtual counters of the active ones.
    tenant_service: dict = field(default_factory=dict)
    tenant_virtual_service: dict = field(default_factory=dict)
    tenant_preemptions: dict = field(default_factory=dict)  # sequences preempted, by tenant
    # Speculative decoding's counts per (adapter, method) (engine/speculation/speculator.py):
    # drafts, draft tokens, accepted tokens and accepted tokens by position.
    spec_decode: dict = field(default_factory=dict)
    # Adapter store objects downloaded into the engine's cache (engine/lora/stored_adapters.py).
    adapter_store_fetches: int = 0


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
    residency = engine.residency
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
        adapters=residency.counts() if residency is not None else {},
        busy_adapters=busy,
        waiting_adapters=waiting,
        adapter_tiers=residency.tiers() if residency is not None else {},
        adapter_loads=residency.loads() if residency is not None else {},
        tenant_service=dict(engine.fair_share.served),
        tenant_virtual_service={k: t["service"] for k, t in engine.fair_share.tenants().items()},
        tenant_preemptions=dict(engine.fair_share.preempted),
        spec_decode=spec_decode_counts(scheduler.speculator),
        adapter_store_fetches=residency.store_fetches if residency is not None else 0,
    )


def spec_decode_counts(speculator) -> dict:
    """(adapter or None, method) -> (drafts, draft tokens, accepted tokens, accepted per
    position); empty without speculative decoding."""
    if speculator is None:
        return {}
    return {
        (s["adapter"], s["method"]): (
            s["drafts"],
            s["draft_tokens"],
            s["accepted_tokens"],
            tuple(s["accepted_per_position"]),
        )
        for s in speculator.stats()
    }
