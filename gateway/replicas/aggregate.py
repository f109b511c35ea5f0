"""Several replicas' engine snapshots as one: what the deployment-wide metrics read."""

from __future__ import annotations

from loragate.engine import EngineStats

_SUMMED = ("unfinished_requests", "running", "waiting", "prompt_tokens", "generation_tokens")
_SUMMED += ("preemptions", "adapter_store_fetches")
# Memory counts that add up across replicas; the ratios are recomputed from them.
_BLOCK_COUNTS = ("allocated_blocks", "free_blocks", "total_blocks", "cached_blocks")
_BLOCK_COUNTS += ("prefix_cache_hit_tokens", "prefix_cache_queried_tokens", "swapped_blocks")
_BLOCK_COUNTS += ("num_preemptions",)


def combined_stats(snapshots: list[EngineStats]) -> EngineStats:
    """Counts added up; each weights' tier the warmest any replica holds it in; loads added."""
    total = EngineStats()
    for s in snapshots:
        for name in _SUMMED:
            setattr(total, name, getattr(total, name) + getattr(s, name))
        for key, value in s.adapters.items():
            total.adapters[key] = total.adapters.get(key, 0) + value
        total.busy_adapters |= s.busy_adapters
        total.waiting_adapters |= s.waiting_adapters
        for sha, tier in s.adapter_tiers.items():
            if total.adapter_tiers.get(sha) != "device":
                total.adapter_tiers[sha] = tier
        for sha, row in s.adapter_loads.items():
            old = total.adapter_loads.get(sha, (0, 0.0, 0, 0.0))
            total.adapter_loads[sha] = tuple(a + b for a, b in zip(old, row, strict=True))
        for key, value in s.tenant_preemptions.items():
            total.tenant_preemptions[key] = total.tenant_preemptions.get(key, 0) + value
        for key, value in s.tenant_service.items():
            total.tenant_service[key] = total.tenant_service.get(key, 0.0) + value
        for key, counts in s.spec_decode.items():
            total.spec_decode[key] = _added_spec_counts(total.spec_decode.get(key), counts)
    total.memory = _combined_memory([s.memory for s in snapshots])
    return total


def _combined_memory(memories: list[dict]) -> dict:
    if not memories:
        return {}
    out = {k: sum(m.get(k, 0) for m in memories) for k in _BLOCK_COUNTS if k in memories[0]}
    out["block_size"] = memories[0].get("block_size", 0)
    total = out.get("total_blocks", 0)
    out["utilization"] = out.get("allocated_blocks", 0) / total if total else 0.0
    queried = out.get("prefix_cache_queried_tokens", 0)
    hits = out.get("prefix_cache_hit_tokens", 0)
    out["prefix_cache_hit_rate"] = hits / queried if queried else 0.0
    slots = sum(m.get("allocated_blocks", 0) for m in memories) * out["block_size"]
    wasted = sum(
        m.get("internal_fragmentation", 0.0) * m.get("allocated_blocks", 0) * out["block_size"]
        for m in memories
    )
    out["internal_fragmentation"] = wasted / slots if slots else 0.0
    return out


def _added_spec_counts(old: tuple | None, new: tuple) -> tuple:
    """Two replicas' speculative-decoding counts for one (adapter, method), added up."""
    if old is None:
        return new
    per_position = [0] * max(len(old[3]), len(new[3]))
    for row in (old[3], new[3]):
        for i, n in enumerate(row):
            per_position[i] += n
    return (old[0] + new[0], old[1] + new[1], old[2] + new[2], tuple(per_position))
