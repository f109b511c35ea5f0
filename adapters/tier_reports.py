"""What the adapter tiers report: counters, each weights' tier, loads, the CPU tier's order.

Plain functions over the two tiers' public reports; their owner (the engine's
AdapterResidency) calls them under its lock.
"""

from __future__ import annotations

from loragate.adapters.cpu_tier import CpuTier
from loragate.adapters.device_tier import DeviceTier
from loragate.adapters.request import LoRARequest
from loragate.adapters.usage import UsageBook

# The names the engine's stats and /metrics read, in their order (the tiers' docstrings
# say what each counts); held_weights: weight sets admitted, unfinished requests hold.
STATS = (
    "device_hits slot_loads device_evictions acquire_waits cpu_hits disk_loads file_reads "
    "vouched_reads cpu_evictions load_seconds slot_load_seconds resident_adapters "
    "cpu_adapters resident_bytes cpu_bytes held_weights"
).split()


def tier_stats(cpu: CpuTier, device: DeviceTier) -> dict[str, float]:
    counts = {**cpu.counts(), **device.counts()}
    return {name: counts[name] for name in STATS}


def tier_of_weights(cpu: CpuTier, device: DeviceTier) -> dict[str, str]:
    """Each weights sha256 in memory: "device" (in a slot) or "cpu"."""
    found = {identity.sha256: "cpu" for identity in cpu.identities()}
    found.update({identity.sha256: "device" for identity in device.slot_of})
    return found


def tier_loads(cpu: CpuTier, device: DeviceTier) -> dict[str, tuple]:
    """Each weights sha256 ever loaded: (disk loads, seconds, slot loads, seconds)."""
    disk, slot = cpu.loads(), device.loads()
    return {sha: (*disk.get(sha, (0, 0.0)), *slot.get(sha, (0, 0.0))) for sha in {**disk, **slot}}


def cpu_resident(cpu: CpuTier, usage: UsageBook) -> list[LoRARequest]:
    """The request that last used each CPU-tier entry, least recently used first."""
    ordered = sorted(cpu.identities(), key=lambda i: usage.entries[i].last_used)
    return [usage.request_of(i) for i in ordered]
