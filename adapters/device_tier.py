"""The device tier: which set of weights sits in which slot of the stacked LoRA tensors.

The slot tensors themselves (layout, in-place copies) are adapters/slots.py; this is the
bookkeeping over them that the cache's ``acquire``, ``remove`` and eviction read. A slot can
be reserved: a loader thread fills it without the cache's lock, no one else takes it
meanwhile, and its weights count only once published.
"""

from __future__ import annotations

import time

import torch

from loragate.adapters.identity import WeightsIdentity
from loragate.adapters.loader import LoRAAdapter
from loragate.adapters.pacing import UNPACED, LoadPacing
from loragate.adapters.slots import DeviceSlots
from loragate.adapters.spec import LoRAModelSpec


class DeviceTier:
    """Slot -> weights and back, over ``max_loras`` slots. Not locked: the cache locks."""

    def __init__(self, spec: LoRAModelSpec, max_loras: int, max_rank: int, device, dtype):
        self.tensors = DeviceSlots(spec, max_loras, max_rank, torch.device(device), dtype)
        self.owner: list[WeightsIdentity | None] = [None] * max_loras
        self.rank = [0] * max_loras
        self.slot_of: dict[WeightsIdentity, int] = {}
        self.reserved: set[int] = set()  # being filled off the lock (``write``, then publish)

    def free_slot(self) -> int | None:
        for slot, owner in enumerate(self.owner):
            if owner is None and slot not in self.reserved:
                return slot
        return None

    def reserve(self) -> int | None:
        """A free slot no one else takes until ``publish`` or ``unreserve``, if any."""
        slot = self.free_slot()
        if slot is not None:
            self.reserved.add(slot)
        return slot

    def write(self, slot: int, adapter: LoRAAdapter, pacing: LoadPacing = UNPACED) -> float:
        """Copy ``adapter``'s weights into ``slot``'s tensors; seconds it took. The slot must
        be reserved or locked, and no running sequence may read it."""
        started = time.perf_counter()
        self.tensors.write(slot, adapter, pacing)
        return time.perf_counter() - started

    def publish(self, slot: int, identity: WeightsIdentity, adapter: LoRAAdapter) -> None:
        """``slot`` holds ``identity``'s weights from now on (whatever held it is forgotten)."""
        self.reserved.discard(slot)
        previous = self.owner[slot]
        if previous is not None:
            del self.slot_of[previous]
        self.owner[slot] = identity
        self.rank[slot] = adapter.rank
        self.slot_of[identity] = slot

    def unreserve(self, slot: int) -> None:
        """A reserved slot's fill was given up: zero it and free it."""
        self.tensors.clear(slot)
        self.reserved.discard(slot)

    def put(self, slot: int, identity: WeightsIdentity, adapter: LoRAAdapter) -> float:
        """Copy ``adapter`` into ``slot`` (whatever held it is forgotten); seconds it took."""
        seconds = self.write(slot, adapter)
        self.publish(slot, identity, adapter)
        return seconds

    def clear(self, identity: WeightsIdentity) -> int | None:
        """Zero and free the slot holding ``identity``, if any; that slot."""
        slot = self.slot_of.pop(identity, None)
        if slot is not None:
            self.owner[slot] = None
            self.rank[slot] = 0
            self.tensors.clear(slot)
        return slot

    def occupied(self) -> dict[int, WeightsIdentity]:
        return {s: i for s, i in enumerate(self.owner) if i is not None}
