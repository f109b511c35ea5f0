"""The device tier: which set of weights sits in which slot of the stacked LoRA tensors.

The slot tensors themselves (layout, in-place copies) are adapters/slots.py; this is the
bookkeeping over them that the cache's ``acquire``, ``remove`` and eviction read.
"""

from __future__ import annotations

import time

import torch

from loragate.adapters.identity import WeightsIdentity
from loragate.adapters.loader import LoRAAdapter
from loragate.adapters.slots import DeviceSlots
from loragate.adapters.spec import LoRAModelSpec


class DeviceTier:
    """Slot -> weights and back, over ``max_loras`` slots. Not locked: the cache locks."""

    def __init__(
        self,
        spec: LoRAModelSpec,
        max_loras: int,
        max_rank: int,
        device,
        dtype,
        borrow: bool = True,
    ):
        # On the CPU, slots borrow the CPU tier's rows rather than copy them (slots.py).
        self.tensors = DeviceSlots(
            spec, max_loras, max_rank, torch.device(device), dtype, borrow=borrow
        )
        self.owner: list[WeightsIdentity | None] = [None] * max_loras
        self.rank = [0] * max_loras
        self.bytes = [0] * max_loras  # what each slot's adapter takes (tier_budget.slot_bytes)
        self.slot_of: dict[WeightsIdentity, int] = {}

    def free_slot(self) -> int | None:
        for slot, owner in enumerate(self.owner):
            if owner is None:
                return slot
        return None

    @property
    def used_bytes(self) -> int:
        return sum(self.bytes)

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

    def occupied(self) -> dict[int, WeightsIdentity]:
        return {s: i for s, i in enumerate(self.owner) if i is not None}
