"""The tiered adapter cache: disk -> CPU memory (LRU) -> device slots.

Both tiers are keyed by the weights' content (``WeightsIdentity``, adapters/identity.py),
never by a request's name, id or path: files that change are new entries everywhere, and
two names (or two int ids) with the same files share one entry. The engine calls
``preload`` when it admits a request (a stat when the files are unchanged) and runs the
request under that ``identity``: ``acquire`` (once per scheduled request, never per token)
returns the slot holding exactly those weights. The engine's step acquires with
``read_files=False``: weights in no memory tier are brought back by ``load`` on a loader
thread while the request waits. The gateway calls ``preload`` when an adapter is registered
so a bad directory is refused before the client hears 201.

Each tier holds at most its count of adapters and its byte budget (adapters/tier_budget.py):
an adapter with whole embedding or output matrices takes the room of several plain ones,
eviction frees as much as a newcomer needs, and one larger than a whole tier is refused
(AdapterTooLargeError) when it is read.

Old weights age out by LRU. Weights an admitted request still needs and that its files no
longer hold are never dropped from the CPU tier (``hold``/``release``), even past
max_cpu_loras, until those requests end; slots running sequences use are never evicted.

Counters (``stats()``):
  device_hits      acquire found the adapter already in a slot
  slot_loads       adapters put in a device slot (copied; on a CPU, borrowed in place)
  device_evictions resident adapters replaced to free a slot
  acquire_waits    acquire calls that returned None (every slot busy)
  cpu_hits         the CPU tier had the adapter (acquire miss or preload)
  disk_loads       adapters read and validated from disk into the CPU tier (misses)
  file_reads       adapter directories read (hashed, unless a stat vouched for them)
  vouched_reads    of those, read without hashing them again because a stat vouched
                   for the files: weights read back for requests admitted under them, or
                   a store object's files as the fetch that checked them left them
  cpu_evictions    adapters dropped from the CPU tier to respect max_cpu_loras
  load_seconds     time spent in disk loads
  slot_load_seconds time spent putting adapters in device slots
  resident_adapters adapters in device slots now
  cpu_adapters     adapters in the CPU tier now
  resident_bytes   bytes the adapters in device slots take (tier_budget.slot_bytes)
  cpu_bytes        bytes the adapters in the CPU tier take (tier_budget.cpu_bytes)
  held_weights     weight sets that admitted, unfinished requests were admitted under
"""

from __future__ import annotations

import threading
import time
from collections import Counter

import torch

from loragate.adapters.cache_reports import CacheReports
from loragate.adapters.device_tier import DeviceTier
from loragate.adapters.errors import AdapterChangedError, AdapterNotInMemory
from loragate.adapters.eviction import ChooseVictim, lru_victim, victim_key
from loragate.adapters.identity import IdentityBook, Vouch, WeightsIdentity
from loragate.adapters.loader import LoRAAdapter, load_adapter, vouched_identity
from loragate.adapters.pacing import ALWAYS_PACED, LoadPacing
from loragate.adapters.read_buffers import ReadBuffers
from loragate.adapters.request import LoRARequest
from loragate.adapters.slots import DeviceSlots
from loragate.adapters.spec import LoRAModelSpec
from loragate.adapters.tier_budget import (
    TierBudget,
    cpu_bytes,
    largest_bytes,
    slot_bytes,
    unit_bytes,
)
from loragate.adapters.usage import UsageBook

_COUNTERS = (
    "device_hits slot_loads device_evictions acquire_waits cpu_hits disk_loads file_reads "
    "vouched_reads "
    "cpu_evictions"
).split()


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return value


class AdapterCache(CacheReports):
    """All known adapters on disk, recent ones in CPU memory, up to max_loras on the device.

    ``remove`` refuses (ValueError) to drop an adapter whose slot is in the busy_slots it
    is given; the engine passes the slots its running sequences use, as for ``acquire``.
    All methods are thread-safe; ``preload`` reads the disk without holding the lock.
    ``book`` is the engine's IdentityBook (adapters/identity.py): what this cache's reads
    hashed, and what the adapter store's checks vouch for, which its reads take the word of;
    its clock stamps the reads. Without one the cache keeps a book of its own.
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
        load_pacing: LoadPacing = ALWAYS_PACED,
        borrow: bool = True,
        max_lora_bytes: int | None = None,
        max_cpu_lora_bytes: int | None = None,
        book: IdentityBook | None = None,
    ):
        self.spec = spec
        self.load_pacing = load_pacing  # the engine's: paced only while its steps run
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
        # borrow: on a CPU, slots read the CPU tier's rows in place (adapters/slots.py).
        self._device = DeviceTier(spec, max_loras, max_lora_rank, device, dtype, borrow)
        self._slots = self._device.tensors
        self._slot_of = self._device.slot_of  # the same dict: identity -> slot
        self._cpu: dict[WeightsIdentity, LoRAAdapter] = {}
        self._cpu_bytes: dict[WeightsIdentity, int] = {}
        # Each tier's count and bytes (adapters/tier_budget.py); the CPU tier holds stacks
        # in the slots' dtype where slots borrow them or copy them beside the step (a GPU),
        # float32 otherwise (DeviceSlots.stack_dtype).
        cpu_dtype = self._slots.stack_dtype
        self.slot_budget = TierBudget.make(
            "device slots",
            max_loras,
            "max_loras",
            unit_bytes(spec, max_lora_rank, dtype),
            largest_bytes(spec, max_lora_rank, dtype, dtype),
            max_lora_bytes,
            "max_lora_bytes",
        )
        self.cpu_budget = TierBudget.make(
            "CPU tier",
            max_cpu_loras,
            "max_cpu_loras",
            unit_bytes(spec, max_lora_rank, cpu_dtype),
            # the vocabulary side is read into float32 (adapters/vocab_extras.py)
            largest_bytes(spec, max_lora_rank, cpu_dtype, torch.float32),
            max_cpu_lora_bytes,
            "max_cpu_lora_bytes",
        )
        self._usage = UsageBook()
        self._holds: Counter[WeightsIdentity] = Counter()
        self._book = book if book is not None else IdentityBook()  # its clock stamps _read
        self._read_buffers = ReadBuffers()  # weights files' reads reuse their memory
        self._lock = threading.RLock()
        self._counters = dict.fromkeys(_COUNTERS, 0)
        # sha256 -> [disk loads, their seconds, slot loads, their seconds] (for metrics)
        self._loads_of: dict[str, list] = {}
        self._seconds = {"load_seconds": 0.0, "slot_load_seconds": 0.0}

    # -- device slot tensors, for the engine's LoRA layers ------------------------------
    @property
    def slot_tensors(self) -> DeviceSlots:
        """The device slots' stacked tensors alone (no lock, no tiers): what a forward pass
        reads. Their storage never moves; a slot is written only while no running sequence
        uses it."""
        return self._slots

    @property
    def scales(self) -> torch.Tensor:
        """``[max_loras]`` scale per slot (0 for an empty slot)."""
        return self._slots.scales

    @property
    def effective_rank(self) -> int:
        """Largest rank among resident adapters; columns past it are zero in every slot."""
        with self._lock:
            return max(self._device.rank)

    # -- admission ----------------------------------------------------------------------
    def preload(self, request: LoRARequest) -> LoRAAdapter:
        """The adapter ``request``'s files hold now, validated, and kept in the CPU tier
        unless the weights admitted requests hold fill it.

        Its ``identity`` is what a request is admitted under. Unchanged files cost one stat
        (no read, no hash); changed files are read, hashed and cached as a new entry, the
        old one left to age out. What the book says a store object's check hashed spares the
        hash of files still stamped as they were then (adapters/loader.py). An AdapterError
        leaves the cache exactly as it was.
        """
        identity, fresh, seconds = self._resolve(request)
        with self._lock:
            adapter = self._cpu_entry(request, identity, fresh, seconds)
            if adapter.identity in self._cpu:  # not kept where held weights fill the tier
                self._usage.touch(adapter.identity, request, used=False)
            return adapter

    def load(self, request: LoRARequest, identity: WeightsIdentity) -> LoRAAdapter:
        """Bring the weights a request was admitted under back into the CPU tier (a loader
        thread's job). AdapterChangedError if its files hold other weights by now."""
        with self._lock:
            adapter = self._cpu.get(identity)
            if adapter is not None:
                return adapter
        # No lock held while reading. Files a stat still vouches for since they hashed to
        # ``identity`` are read without hashing them again (adapters/loader.py).
        vouched = self._book.entry(request.lora_path)
        vouched = vouched if vouched is not None and vouched[1] == identity else None
        fresh, seconds = self._read(request, vouched)
        with self._lock:
            return self._cpu_entry(request, identity, fresh, seconds, admitted=True)

    def in_slot(self, identity: WeightsIdentity) -> bool:
        with self._lock:
            return identity in self._slot_of

    def in_memory(self, identity: WeightsIdentity) -> bool:
        """Whether ``identity``'s weights are in the CPU tier or a device slot, so that
        ``acquire`` needs no file."""
        with self._lock:
            return identity in self._cpu or identity in self._slot_of

    def hold(self, identity: WeightsIdentity) -> None:
        """A request was admitted under ``identity``: keep weights no file gives any more."""
        with self._lock:
            self._holds[identity] += 1

    def release(self, identity: WeightsIdentity) -> None:
        """A request admitted under ``identity`` ended."""
        with self._lock:
            self._holds[identity] -= 1
            if self._holds[identity] <= 0:
                del self._holds[identity]

    def pin(self, request: LoRARequest, pinned: bool = True) -> None:
        """Mark ``request``'s adapter directory pinned (or not): eviction candidates say so,
        and the built-in policy evicts pinned adapters last."""
        with self._lock:
            if pinned:
                self._usage.pinned_paths.add(request.lora_path)
            else:
                self._usage.pinned_paths.discard(request.lora_path)

    # -- device tier ------------------------------------------------------------------
    def slot_of(self, request: LoRARequest) -> int | None:
        """The slot holding the weights ``request``'s files had when last hashed, if any."""
        with self._lock:
            return self._slot_of.get(self._book.last(request.lora_path))

    def acquire(
        self,
        request: LoRARequest,
        busy_slots=frozenset(),
        identity: WeightsIdentity | None = None,
        *,
        tenant: str | None = None,
        read_files: bool = True,
    ) -> int | None:
        """The slot holding the weights ``identity`` names, loading them if needed; None if
        all slots are busy.

        ``identity`` is what the request was admitted under (``preload(...).identity``);
        without one, the files as they are now. ``busy_slots`` are the slots running
        sequences use: they are never evicted. ``tenant`` is the tenant of the request (what
        eviction plugins see). Raises an AdapterError if the weights cannot be loaded
        (AdapterChangedError if the files changed since admission and the admitted weights
        left memory), leaving the cache unchanged. With ``read_files=False`` (the engine's
        step) weights in no memory tier raise AdapterNotInMemory instead of being read.
        """
        fresh, seconds = None, 0.0
        if identity is None:
            identity, fresh, seconds = self._resolve(request)
        with self._lock:
            slot = self._slot_of.get(identity)
            if slot is not None:
                self._counters["device_hits"] += 1
                self._usage.touch(identity, request, used=True, tenant=tenant)
                return slot
            if not read_files and identity not in self._cpu:
                raise AdapterNotInMemory(f"adapter {request.lora_name!r}: {identity}")
            adapter = self._cpu.get(identity)
            if adapter is None and fresh is not None and fresh.identity == identity:
                adapter = fresh
            read = adapter is None
            if read:  # read (or refused) only once a slot could be had
                if self._device.free_slot() is None and set(self._device.occupied()) <= set(
                    busy_slots
                ):
                    self._counters["acquire_waits"] += 1
                    return None
                adapter = self._cpu_entry(request, identity, fresh, seconds, admitted=True)
            size = slot_bytes(adapter, self._slots.dtype)
            victims = self._device_victims(busy_slots, size)
            if victims is None:
                self._counters["acquire_waits"] += 1
                return None
            if not read:
                adapter = self._cpu_entry(request, identity, fresh, seconds, admitted=True)
            for victim in victims[1:]:  # their slots are zeroed and left free
                self._device.clear(victim)
            slot = self._slot_of[victims[0]] if victims else self._device.free_slot()
            put_seconds = self._device.put(slot, identity, adapter, size)
            self._seconds["slot_load_seconds"] += put_seconds
            self._counters["slot_loads"] += 1
            self._count_load(identity, 2, put_seconds)
            for victim in victims:
                self._forget_usage_if_gone(victim)
                self._counters["device_evictions"] += 1
            self._usage.touch(identity, request, used=True, tenant=tenant)
            return slot

    def _device_victims(self, busy_slots, size: int) -> list[WeightsIdentity] | None:
        """The resident weights to evict, in the policy's order, so that an adapter of
        ``size`` bytes fits (a slot and its bytes): [] when it fits already, None when
        evicting every slot no running sequence uses would not make room."""
        device, budget = self._device, self.slot_budget
        occupied = device.occupied()
        adapters, used = len(occupied), device.used_bytes
        victims: list[WeightsIdentity] = []
        while not budget.fits(adapters, used, size):
            candidates = [
                self._usage.candidate(owner, slot)
                for slot, owner in occupied.items()
                if slot not in busy_slots and owner not in victims
            ]
            if not candidates:
                return None
            key = self._victim(candidates, "device")
            victim = next(owner for owner in self._slot_of if self._usage.key(owner) == key)
            victims.append(victim)
            adapters -= 1
            used -= device.bytes[self._slot_of[victim]]
        return victims

    def _victim(self, candidates: list[dict], tier: str) -> tuple:
        """The key of the candidate the eviction policy names (a ValueError if none)."""
        try:
            return victim_key(self._choose_victim(candidates, tier), candidates, tier)
        except ValueError as exc:
            raise ValueError(f"choose_victim {exc}") from None

    # -- CPU tier ---------------------------------------------------------------------
    def admission_identity(self, request: LoRARequest) -> WeightsIdentity:
        """What a request naming ``request`` is admitted under: ``known_identity`` where a
        stat vouches for its files, otherwise read, validated and kept in the CPU tier where
        it has room beside the weights admitted requests hold (``preload``). An AdapterError
        leaves the cache as it was."""
        identity = self.known_identity(request)
        return identity if identity is not None else self.preload(request).identity

    def room_to_load(self, loading: int = 0) -> bool:
        """Whether weights may be read into the CPU tier for an admitted request now, with
        ``loading`` reads already under way: the tier has a place and bytes left beside the
        weights admitted requests hold, which never leave it for another load."""
        with self._lock:
            held = [identity for identity in self._cpu if self._holds.get(identity)]
            used = sum(self._cpu_bytes[identity] for identity in held)
            return len(held) + loading < self.cpu_budget.count and used < self.cpu_budget.limit

    def known_identity(self, request: LoRARequest) -> WeightsIdentity | None:
        """The identity of ``request``'s files when a stat vouches for them (unchanged since
        read), whether or not their weights are still in memory: admitting a request under it
        reads no file, and where the weights left memory the request's own load reads them
        once the tier has room (``room_to_load``)."""
        identity = self._book.known(request.lora_path)
        with self._lock:
            if identity is not None and identity in self._cpu:
                self._usage.touch(identity, request, used=False)
        return identity

    def _resolve(self, request: LoRARequest) -> tuple[WeightsIdentity, LoRAAdapter | None, float]:
        """The identity of ``request``'s files now: from a stat when they are unchanged since
        read, otherwise by reading them (the adapter read is returned too; files a store's
        check vouched for and still so stamped are not hashed again). No lock held."""
        identity = self._book.known(request.lora_path)
        if identity is not None:
            return identity, None, 0.0
        adapter, seconds = self._read(request, self._book.entry(request.lora_path))
        return adapter.identity, adapter, seconds

    def _cpu_entry(
        self,
        request: LoRARequest,
        identity: WeightsIdentity,
        fresh: LoRAAdapter | None,
        seconds: float,
        admitted: bool = False,
    ) -> LoRAAdapter:
        """The CPU tier's copy of ``identity``, read from disk (or taken from ``fresh``, just
        read) on a miss. With ``admitted``, ``identity`` is fixed: files that now hold other
        weights raise AdapterChangedError instead of being served."""
        adapter = self._cpu.get(identity)
        if adapter is not None:
            self._counters["cpu_hits"] += 1
            return adapter
        if fresh is None:
            fresh, seconds = self._read(request)
        if fresh.identity != identity:
            if admitted:
                raise AdapterChangedError(
                    f"adapter {request.lora_name!r}: the files changed after this request "
                    f"was admitted ({identity} -> {fresh.identity}) and the weights it was "
                    "admitted with are no longer in memory; send the request again",
                    path=request.lora_path,
                )
            identity = fresh.identity
            if identity in self._cpu:
                self._counters["cpu_hits"] += 1
                return self._cpu[identity]
        self._insert_cpu(identity, request, fresh, seconds, admitted)
        return fresh

    def _read(
        self, request: LoRARequest, vouched: Vouch | None = None
    ) -> tuple[LoRAAdapter, float]:
        started = time.perf_counter()
        with self.load_pacing.loading():
            adapter = load_adapter(
                request.lora_path,
                self.spec,
                self.max_lora_rank,
                self.strict_base_model,
                self.load_pacing,
                # On a CPU the slots read the stacks in place, on a GPU copy them as they are.
                self._slots.stack_dtype,
                vouched,
                self._read_buffers,
                # A GPU copies them into slots beside the step: from page-locked memory.
                pin_memory=self._slots.device.type == "cuda",
                clock=self._book.clock,
            )
            # Larger than a whole tier: refused before anything remembers it.
            self.cpu_budget.check(request.lora_name, cpu_bytes(adapter), adapter.path)
            self.slot_budget.check(
                request.lora_name, slot_bytes(adapter, self._slots.dtype), adapter.path
            )
            self._slots.prepare(adapter, self.load_pacing)  # off the step that admits it
        self._book.record(request.lora_path, adapter.stamp, adapter.identity, request.lora_name)
        with self._lock:
            self._counters["file_reads"] += 1
            self._counters["vouched_reads"] += vouched_identity(adapter.stamp, vouched) is not None
        return adapter, time.perf_counter() - started

    def _insert_cpu(
        self,
        identity: WeightsIdentity,
        request: LoRARequest,
        adapter: LoRAAdapter,
        seconds: float,
        admitted: bool = False,
    ) -> None:
        """Keep ``adapter`` in the CPU tier, evicting weights no admitted request holds. Where
        only held weights are left, an admitted request's load is kept past the bound (loads
        start only while there is room, so only loads already under way get here) and a
        read for admission is not kept: its request's own load reads it when there is room.
        Held weights never leave for another request's weights: they would be read again at
        their turn, and a burst over more adapters than the tier holds then read each many
        times over (the fleet check run: 1542 disk loads for 240 requests)."""
        self._counters["disk_loads"] += 1
        self._seconds["load_seconds"] += seconds
        self._count_load(identity, 0, seconds)
        size = cpu_bytes(adapter)
        while not self.cpu_budget.fits(len(self._cpu), sum(self._cpu_bytes.values()), size):
            droppable = [held for held in self._cpu if not self._holds.get(held)]
            if not droppable and not admitted:
                return
            if not droppable:
                break
            candidates = [
                self._usage.candidate(held, self._slot_of.get(held)) for held in droppable
            ]
            key = self._victim(candidates, "cpu")
            victim = next(held for held in droppable if self._usage.key(held) == key)
            del self._cpu[victim]
            del self._cpu_bytes[victim]
            self._forget_usage_if_gone(victim)
            self._counters["cpu_evictions"] += 1
        self._cpu[identity] = adapter
        self._cpu_bytes[identity] = size
        self._usage.sized(identity, request, adapter.size_bytes)

    # -- both tiers -------------------------------------------------------------------
    def remove(self, request: LoRARequest, busy_slots=frozenset()) -> bool:
        """Forget the weights ``request`` used in every tier (their slots are zeroed); True if
        any were cached. Weights an admitted request still needs stay in the CPU tier.

        Raises ValueError, changing nothing, if one of their slots is in ``busy_slots``.
        """
        with self._lock:
            current = self._book.last(request.lora_path)
            identities = {i for i, u in self._usage.entries.items() if u.request == request}
            if current is not None and (current in self._cpu or current in self._slot_of):
                identities.add(current)
            for identity in identities:
                slot = self._slot_of.get(identity)
                if slot is not None and slot in busy_slots:
                    raise ValueError(
                        f"adapter {request.lora_name!r} is in slot {slot}, which running "
                        "sequences use"
                    )
            found = False
            for identity in identities:
                if not self._holds.get(identity):
                    found |= self._cpu.pop(identity, None) is not None
                    self._cpu_bytes.pop(identity, None)
                found |= self._device.clear(identity) is not None
                self._forget_usage_if_gone(identity)
            return found

    def _forget_usage_if_gone(self, identity: WeightsIdentity) -> None:
        if identity not in self._cpu and identity not in self._slot_of:
            self._usage.entries.pop(identity, None)
