"""The device tier: which set of weights sits in which slot of the stacked LoRA tensors.

The slot tensors themselves (layout, in-place copies, borrowed rows) are adapters/slots.py;
this is the bookkeeping over them: each slot's weights, rank and bytes, the tier's budget
(``max_loras`` adapters and ``max_lora_bytes``, adapters/tier_budget.py), and the residents
to evict for a newcomer, chosen by asking the eviction plugin. Slots running sequences use
are never evicted.

A plain object, not locked: the engine's AdapterResidency (engine/lora/adapter_residency.py)
is its one owner and calls it under its lock.

Counters (``counts()``):
  device_hits      acquire found the adapter already in a slot
  slot_loads       adapters put in a device slot (copied; on a CPU, borrowed in place)
  device_evictions resident adapters replaced to free a slot
  acquire_waits    acquire calls that returned None (every slot busy)
  slot_load_seconds time spent putting adapters in device slots
  resident_adapters adapters in device slots now
  resident_bytes   bytes the adapters in device slots take (tier_budget.slot_bytes)
"""

from __future__ import annotations

import time

import torch

from loragate.adapters.eviction import ChooseVictim, chosen_victim
from loragate.adapters.identity import WeightsIdentity
from loragate.adapters.loader import LoRAAdapter
from loragate.adapters.pacing import LoadPacing
from loragate.adapters.slots import DeviceSlots
from loragate.adapters.spec import LoRAModelSpec
from loragate.adapters.tier_budget import TierBudget, largest_bytes, slot_bytes, unit_bytes
from loragate.adapters.usage import UsageBook

COUNTERS = ("device_hits", "slot_loads", "device_evictions", "acquire_waits")


class DeviceTier:
    """Slot -> weights and back, over ``max_loras`` slots."""

    def __init__(
        self,
        spec: LoRAModelSpec,
        max_loras: int,
        max_rank: int,
        device,
        dtype,
        borrow: bool = True,
        *,
        choose_victim: ChooseVictim,
        max_lora_bytes: int | None = None,
    ):
        # On the CPU, slots borrow the CPU tier's rows rather than copy them (slots.py).
        self.tensors = DeviceSlots(
            spec, max_loras, max_rank, torch.device(device), dtype, borrow=borrow
        )
        self.budget = TierBudget.make(
            "device slots",
            max_loras,
            "max_loras",
            unit_bytes(spec, max_rank, dtype),
            largest_bytes(spec, max_rank, dtype, dtype),
            max_lora_bytes,
            "max_lora_bytes",
        )
        self._choose_victim = choose_victim
        self.owner: list[WeightsIdentity | None] = [None] * max_loras
        self.rank = [0] * max_loras
        self.bytes = [0] * max_loras  # what each slot's adapter takes (tier_budget.slot_bytes)
        self.slot_of: dict[WeightsIdentity, int] = {}
        self._counters = dict.fromkeys(COUNTERS, 0)
        self._slot_load_seconds = 0.0
        self._loads_of: dict[str, list] = {}  # sha256 -> [slot loads, their seconds]

    def free_slot(self) -> int | None:
        for slot, owner in enumerate(self.owner):
            if owner is None:
                return slot
        return None

    @property
    def used_bytes(self) -> int:
        return sum(self.bytes)

    @property
    def effective_rank(self) -> int:
        """Largest rank among resident adapters; columns past it are zero in every slot."""
        return max(self.rank)

    def occupied(self) -> dict[int, WeightsIdentity]:
        return {s: i for s, i in enumerate(self.owner) if i is not None}

    def all_busy(self, busy_slots) -> bool:
        """No slot is free and running sequences use every one."""
        return self.free_slot() is None and set(self.occupied()) <= set(busy_slots)

    # -- newcomers ----------------------------------------------------------------------
    def size_of(self, adapter: LoRAAdapter) -> int:
        """What ``adapter`` takes in a slot."""
        return slot_bytes(adapter, self.tensors.dtype)

    def take_in(self, name: str, adapter: LoRAAdapter, pacing: LoadPacing) -> None:
        """A read's part for the slots: refuse an adapter larger than the whole tier
        (AdapterTooLargeError), and check its rows off the step that admits it."""
        self.budget.check(name, self.size_of(adapter), adapter.path)
        self.tensors.prepare(adapter, pacing)

    def hit(self) -> None:
        self._counters["device_hits"] += 1

    def wait(self) -> None:
        """An acquire found every slot it could take busy."""
        self._counters["acquire_waits"] += 1

    def victims(self, busy_slots, size: int, usage: UsageBook) -> list[WeightsIdentity] | None:
        """The resident weights to evict, in the policy's order, so that an adapter of
        ``size`` bytes fits (a slot and its bytes): [] when it fits already, None when
        evicting every slot no running sequence uses would not make room. ``usage``
        describes the candidates to the eviction plugin."""
        occupied = self.occupied()
        adapters, used = len(occupied), self.used_bytes
        victims: list[WeightsIdentity] = []
        while not self.budget.fits(adapters, used, size):
            candidates = [
                usage.candidate(owner, slot)
                for slot, owner in occupied.items()
                if slot not in busy_slots and owner not in victims
            ]
            if not candidates:
                return None
            key = chosen_victim(self._choose_victim, candidates, "device")
            victim = next(owner for owner in self.slot_of if usage.key(owner) == key)
            victims.append(victim)
            adapters -= 1
            used -= self.bytes[self.slot_of[victim]]
        return victims

    def replace(
        self,
        victims: list[WeightsIdentity],
        identity: WeightsIdentity,
        adapter: LoRAAdapter,
        size: int,
    ) -> int:
        """Evict ``victims`` (the first one's slot takes ``adapter``, the others' are zeroed
        and left free; with none, a free slot takes it) and put ``adapter`` in; its slot."""
        for victim in victims[1:]:
            self.clear(victim)
        slot = self.slot_of[victims[0]] if victims else self.free_slot()
        seconds = self.put(slot, identity, adapter, size)
        self._slot_load_seconds += seconds
        self._counters["slot_loads"] += 1
        row = self._loads_of.setdefault(identity.sha256, [0, 0.0])
        row[0] += 1
        row[1] += seconds
        self._counters["device_evictions"] += len(victims)
        return slot

    def put(
        self, slot: int, identity: WeightsIdentity, adapter: LoRAAdapter, size: int = 0
    ) -> float:
        """Put ``adapter`` in ``slot`` (whatever held it is forgotten): copied, or on the CPU
        borrowed where it lies; seconds it took."""
        started = time.perf_counter()
        self.tensors.write(slot, adapter)
        previous = self.owner[slot]
        if previous is not None:
            del self.slot_of[previous]
        self.owner[slot] = identity
        self.rank[slot] = adapter.rank
        self.bytes[slot] = size
        self.slot_of[identity] = slot
        return time.perf_counter() - started

    def clear(self, identity: WeightsIdentity) -> int | None:
        """Zero and free the slot holding ``identity``, if any; that slot."""
        slot = self.slot_of.pop(identity, None)
        if slot is not None:
            self.owner[slot] = None
            self.rank[slot] = 0
            self.bytes[slot] = 0
            self.tensors.clear(slot)
        return slot

    # -- what it reports ----------------------------------------------------------------
    def counts(self) -> dict[str, float]:
        """Its counters, slot_load_seconds, and resident_adapters and resident_bytes now."""
        return {
            **self._counters,
            "slot_load_seconds": self._slot_load_seconds,
            "resident_adapters": len(self.slot_of),
            "resident_bytes": self.used_bytes,
        }

    def loads(self) -> dict[str, tuple[int, float]]:
        """Each weights sha256 ever put in a slot: (slot loads, their seconds)."""
        return {sha: (row[0], row[1]) for sha, row in self._loads_of.items()}
