"""How many adapters the engine keeps resident, when the operator does not say: sized from
the machine, and said in the start log.

On a GPU a slot is a copy of the adapter in device memory, so the slots are few (8, as
vLLM's ``max_loras`` is small) and the CPU tier behind them larger (64). On a CPU the slots
*borrow* the CPU tier's rows in place (adapters/slots.py): a slot costs no copy, only the
memory its adapter already takes in the tier. Counting slots as a GPU does would leave a
CPU machine's memory idle and send every ninth adapter through an eviction. So on a CPU
both counts come from memory: ``CPU_ADAPTER_SHARE`` of the memory available at start over
the bytes of one adapter of ``max_lora_rank`` on every module (adapters/tier_budget.py's
``unit_bytes``, in the slots' dtype), between ``CPU_MIN_ADAPTERS`` and
``CPU_MAX_ADAPTERS``; every resident adapter may be in a batch at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from loragate.adapters.spec import LoRAModelSpec
from loragate.adapters.tier_budget import unit_bytes
from loragate.engine.api.config import EngineConfig

GPU_SLOTS = 8
GPU_CPU_TIER = 64
CPU_ADAPTER_SHARE = 0.25
CPU_MIN_ADAPTERS = 64
CPU_MAX_ADAPTERS = 4096
MEMINFO = Path("/proc/meminfo")


@dataclass(frozen=True)
class LoraCapacity:
    max_loras: int
    max_cpu_loras: int
    reason: str  # how they were chosen, for the start log

    def describe(self) -> str:
        return f"{self.max_loras} slots, {self.max_cpu_loras} in the CPU tier ({self.reason})"


def available_memory(meminfo: Path = MEMINFO) -> int:
    """Bytes of memory available to new work (MemAvailable), or 0 where unreadable."""
    try:
        for line in meminfo.read_text().splitlines():
            name, _, value = line.partition(":")
            if name == "MemAvailable":
                return int(value.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def lora_capacity(
    config: EngineConfig,
    spec: LoRAModelSpec,
    device: torch.device,
    dtype: torch.dtype,
    memory: int | None = None,
) -> LoraCapacity:
    """The slot and CPU-tier counts for ``config``: the operator's where given, else from
    the device (``memory``: bytes available; read from /proc/meminfo when None)."""
    given_slots, given_tier = config.max_loras, config.max_cpu_loras
    if given_slots is not None and given_tier is not None:
        return LoraCapacity(given_slots, given_tier, "as configured")
    if device.type != "cpu":
        slots = GPU_SLOTS if given_slots is None else given_slots
        tier = max(GPU_CPU_TIER, slots) if given_tier is None else given_tier
        if given_tier is not None and given_tier < slots:
            slots = given_tier  # a smaller tier given: as many slots as it holds
        return LoraCapacity(slots, tier, "a GPU's defaults: slots are copies in device memory")
    memory = available_memory() if memory is None else memory
    unit = unit_bytes(spec, config.max_lora_rank, dtype)
    fits = int(memory * CPU_ADAPTER_SHARE // unit)
    count = min(max(fits, CPU_MIN_ADAPTERS), CPU_MAX_ADAPTERS)
    reason = (
        f"sized from memory: {CPU_ADAPTER_SHARE:.0%} of {memory / 2**30:.1f} GiB available "
        f"over {unit / 2**20:.1f} MiB an adapter of rank {config.max_lora_rank} on every "
        f"module in {str(dtype).removeprefix('torch.')}, between {CPU_MIN_ADAPTERS} and "
        f"{CPU_MAX_ADAPTERS}; slots borrow the CPU tier's rows"
    )
    tier = count if given_tier is None else given_tier
    slots = tier if given_slots is None else given_slots
    if given_slots is not None and given_tier is None:
        tier = max(tier, slots)
    return LoraCapacity(slots, tier, reason)
