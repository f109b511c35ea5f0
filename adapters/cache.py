"""The tiered adapter cache: disk -> CPU memory (LRU) -> device slots.

The engine calls ``acquire`` once per scheduled request (never per token) to get the
slot its adapter occupies; the gateway calls ``preload`` when an adapter is registered
so a bad directory is refused before the client hears 201.

Counters (``stats()``):
  device_hits      acquire found the adapter already in a slot
  slot_loads       adapters copied into a device slot
  device_evictions resident adapters replaced to free a slot
  acquire_waits    acquire calls that returned None (every slot busy)
  cpu_hits         the CPU tier had the adapter (acquire miss or preload)
  disk_loads       adapters read and validated from disk (CPU tier misses)
  cpu_evictions    adapters dropped from the CPU tier to respect max_cpu_loras
  load_seconds     time spent in disk loads
  slot_load_seconds time spent copying into device slots
  resident_adapters adapters in device slots now
  cpu_adapters     adapters in the CPU tier now
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import torch

from loragate.adapters.eviction import ChooseVictim, lru_victim, request_key, resolve_victim
from loragate.adapters.loader import LoRAAdapter, load_adapter
from loragate.adapters.request import LoRARequest
from loragate.adapters.slots import DeviceSlots
from loragate.adapters.spec import LoRAModelSpec


@dataclass
class _Usage:
    """Shared by both tiers: one adapter's recency and how often requests used it."""

    last_used: int
    uses: int = 0
    size_bytes: int = 0


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return value


class AdapterCache:
    """All known adapters on disk, recent ones in CPU memory, up to max_loras on the device.

    ``remove`` refuses (ValueError) to drop an adapter whose slot is in the busy_slots it
    is given; the engine passes the slots its running sequences use, as for ``acquire``.
    All methods are thread-safe; ``preload`` reads the disk without holding the lock.
    """

    def __init__(
        self,
        spec: LoRAModelSpec,
        *,
        max_loras: int,
        max_lora_rank: int,
        max_cpu_loras: int,
        device="cpu",
        dtype: torch.dtype = torch.float32,
        choose_victim: ChooseVictim | None = None,
        strict_base_model: bool = False,
    ):
        self.spec = spec
        self.max_loras = _positive_int("max_loras", max_loras)
        self.max_lora_rank = _positive_int("max_lora_rank", max_lora_rank)
        self.max_cpu_loras = _positive_int("max_cpu_loras", max_cpu_loras)
        if max_cpu_loras < max_loras:
            raise ValueError(
                f"max_cpu_loras ({max_cpu_loras}) must be >= max_loras ({max_loras}): "
                "every adapter in a device slot passes through the CPU tier"
            )
        if not dtype.is_floating_point:
            raise ValueError(f"dtype must be a floating point dtype, got {dtype}")
        self.strict_base_model = strict_base_model
        self._choose_victim = choose_victim or lru_victim
        self._slots = DeviceSlots(spec, max_loras, max_lora_rank, torch.device(device), dtype)
        self._slot_owner: list[LoRARequest | None] = [None] * max_loras
        self._slot_rank = [0] * max_loras
        self._slot_of: dict[LoRARequest, int] = {}
        self._cpu: dict[LoRARequest, LoRAAdapter] = {}
        self._usage: dict[LoRARequest, _Usage] = {}
        self._clock = 0
        self._lock = threading.RLock()
        self._counters = dict.fromkeys(
            (
                "device_hits",
                "slot_loads",
                "device_evictions",
                "acquire_waits",
                "cpu_hits",
                "disk_loads",
                "cpu_evictions",
            ),
            0,
        )
        self._seconds = {"load_seconds": 0.0, "slot_load_seconds": 0.0}

    # -- device slot tensors, for the engine's LoRA layers ------------------------------
    def lora_a(self, layer: int, module: str) -> torch.Tensor:
        """``[max_loras, max_lora_rank, d_in]``: a view whose storage never moves."""
        return self._slots.module_a(layer, module)

    def lora_b(self, layer: int, module: str) -> torch.Tensor:
        """``[max_loras, d_out, max_lora_rank]``: a view whose storage never moves."""
        return self._slots.module_b(layer, module)

    @property
    def groups(self) -> dict[str, tuple[str, ...]]:
        """Module groups sharing one stack: the spec's fused groups, other modules alone."""
        return self._slots.groups

    def group_weights(self, layer: int, group: str, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A ``[max_loras, rank*M, d_in]`` and B ``[max_loras, D, rank*M]`` of a module group
        cut to ``rank``: one lora_shrink and one lora_expand apply every module of the group
        to its columns of the fused output. Views; see adapters/slots.py for the layout."""
        return self._slots.group_weights(layer, group, rank)

    @property
    def scales(self) -> torch.Tensor:
        """``[max_loras]`` scale per slot (0 for an empty slot)."""
        return self._slots.scales

    @property
    def effective_rank(self) -> int:
        """Largest rank among resident adapters; columns past it are zero in every slot."""
        with self._lock:
            return max(self._slot_rank)

    # -- device tier ------------------------------------------------------------------
    def slot_of(self, request: LoRARequest) -> int | None:
        with self._lock:
            return self._slot_of.get(request)

    def acquire(self, request: LoRARequest, busy_slots=frozenset()) -> int | None:
        """The slot holding ``request``'s adapter, loading it if needed; None if all slots are busy.

        ``busy_slots`` are the slots running sequences use: they are never evicted. Raises
        an AdapterError if the adapter cannot be loaded, leaving the cache unchanged.
        """
        with self._lock:
            slot = self._slot_of.get(request)
            if slot is not None:
                self._counters["device_hits"] += 1
                self._touch(request, used=True)
                return slot
            slot = self._free_slot()
            victim = None
            if slot is None:
                victim = self._device_victim(busy_slots)
                if victim is None:
                    self._counters["acquire_waits"] += 1
                    return None
                slot = self._slot_of[victim]
            adapter = self._cpu_get(request)
            if victim is not None:
                del self._slot_of[victim]
                self._forget_usage_if_gone(victim)
                self._counters["device_evictions"] += 1
            started = time.perf_counter()
            self._slots.write(slot, adapter)
            self._seconds["slot_load_seconds"] += time.perf_counter() - started
            self._counters["slot_loads"] += 1
            self._slot_owner[slot] = request
            self._slot_rank[slot] = adapter.rank
            self._slot_of[request] = slot
            self._touch(request, used=True)
            return slot

    def _free_slot(self) -> int | None:
        for slot, owner in enumerate(self._slot_owner):
            if owner is None:
                return slot
        return None

    def _device_victim(self, busy_slots) -> LoRARequest | None:
        candidates = [
            self._candidate(owner, slot)
            for slot, owner in enumerate(self._slot_owner)
            if owner is not None and slot not in busy_slots
        ]
        if not candidates:
            return None
        key = resolve_victim(self._choose_victim(candidates, "device"), candidates, "device")
        return next(owner for owner in self._slot_of if request_key(owner) == key)

    # -- CPU tier ---------------------------------------------------------------------
    def in_cpu(self, request: LoRARequest) -> bool:
        """Whether ``request``'s adapter is in CPU memory (so using it reads no file)."""
        with self._lock:
            return request in self._cpu

    def preload(self, request: LoRARequest) -> LoRAAdapter:
        """Validate and load ``request``'s adapter into the CPU tier.

        An AdapterError leaves the cache exactly as it was.
        """
        with self._lock:
            adapter = self._cpu.get(request)
            if adapter is not None:
                self._counters["cpu_hits"] += 1
                self._touch(request, used=False)
                return adapter
        adapter, seconds = self._read(request)
        with self._lock:
            if request in self._cpu:  # another thread loaded it meanwhile
                self._counters["cpu_hits"] += 1
                return self._cpu[request]
            self._insert_cpu(request, adapter, seconds)
            self._touch(request, used=False)
            return adapter

    def _cpu_get(self, request: LoRARequest) -> LoRAAdapter:
        adapter = self._cpu.get(request)
        if adapter is not None:
            self._counters["cpu_hits"] += 1
            return adapter
        adapter, seconds = self._read(request)
        self._insert_cpu(request, adapter, seconds)
        return adapter

    def _read(self, request: LoRARequest) -> tuple[LoRAAdapter, float]:
        started = time.perf_counter()
        adapter = load_adapter(
            request.lora_path, self.spec, self.max_lora_rank, self.strict_base_model
        )
        return adapter, time.perf_counter() - started

    def _insert_cpu(self, request: LoRARequest, adapter: LoRAAdapter, seconds: float) -> None:
        self._counters["disk_loads"] += 1
        self._seconds["load_seconds"] += seconds
        while len(self._cpu) >= self.max_cpu_loras:
            candidates = [self._candidate(req, self._slot_of.get(req)) for req in self._cpu]
            key = resolve_victim(self._choose_victim(candidates, "cpu"), candidates, "cpu")
            victim = next(req for req in self._cpu if request_key(req) == key)
            del self._cpu[victim]
            self._forget_usage_if_gone(victim)
            self._counters["cpu_evictions"] += 1
        self._cpu[request] = adapter
        usage = self._usage.setdefault(request, _Usage(last_used=0))
        usage.size_bytes = adapter.size_bytes

    # -- both tiers -------------------------------------------------------------------
    def remove(self, request: LoRARequest, busy_slots=frozenset()) -> bool:
        """Forget ``request`` in every tier (its slot is zeroed); True if it was cached.

        Raises ValueError, changing nothing, if its slot is in ``busy_slots``.
        """
        with self._lock:
            slot = self._slot_of.get(request)
            if slot is not None and slot in busy_slots:
                raise ValueError(
                    f"adapter {request.lora_name!r} is in slot {slot}, which running sequences use"
                )
            found = self._cpu.pop(request, None) is not None
            if slot is not None:
                del self._slot_of[request]
                self._slot_owner[slot] = None
                self._slot_rank[slot] = 0
                self._slots.clear(slot)
                found = True
            self._usage.pop(request, None)
            return found

    def resident(self) -> dict[int, LoRARequest]:
        """Slot -> adapter for every occupied device slot."""
        with self._lock:
            return {s: r for s, r in enumerate(self._slot_owner) if r is not None}

    def cpu_resident(self) -> list[LoRARequest]:
        """Adapters in the CPU tier, least recently used first."""
        with self._lock:
            return sorted(self._cpu, key=lambda req: self._usage[req].last_used)

    def stats(self) -> dict[str, float]:
        with self._lock:
            return {
                **self._counters,
                **self._seconds,
                "resident_adapters": len(self._slot_of),
                "cpu_adapters": len(self._cpu),
            }

    # -- helpers ----------------------------------------------------------------------
    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    def _touch(self, request: LoRARequest, *, used: bool) -> None:
        usage = self._usage.setdefault(request, _Usage(last_used=0))
        usage.last_used = self._tick()
        usage.uses += int(used)

    def _forget_usage_if_gone(self, request: LoRARequest) -> None:
        if request not in self._cpu and request not in self._slot_of:
            self._usage.pop(request, None)

    def _candidate(self, request: LoRARequest, slot: int | None) -> dict:
        usage = self._usage[request]
        return {
            "key": request_key(request),
            "name": request.lora_name,
            "lora_int_id": request.lora_int_id,
            "path": request.lora_path,
            "tenant": None,
            "last_used": usage.last_used,
            "uses": usage.uses,
            "size_bytes": usage.size_bytes,
            "pinned": False,
            "slot": slot,
        }
