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

The tiers are plain objects (adapters/cpu_tier.py, adapters/device_tier.py); ``stats()``
names their counters (adapters/tier_reports.py).
"""

from __future__ import annotations

import threading
import time

import torch

from loragate.adapters import tier_reports
from loragate.adapters.cpu_tier import CpuTier
from loragate.adapters.device_tier import DeviceTier
from loragate.adapters.errors import AdapterChangedError, AdapterNotInMemory
from loragate.adapters.eviction import ChooseVictim, lru_victim
from loragate.adapters.identity import IdentityBook, Vouch, WeightsIdentity
from loragate.adapters.loader import LoRAAdapter, vouched_identity
from loragate.adapters.pacing import ALWAYS_PACED, LoadPacing
from loragate.adapters.request import LoRARequest
from loragate.adapters.slots import DeviceSlots
from loragate.adapters.spec import LoRAModelSpec
from loragate.adapters.usage import UsageBook


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return value


class AdapterCache:
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
        choose_victim = choose_victim or lru_victim
        # borrow: on a CPU, slots read the CPU tier's rows in place (adapters/slots.py).
        self._device = DeviceTier(
            spec,
            max_loras,
            max_lora_rank,
            device,
            dtype,
            borrow,
            choose_victim=choose_victim,
            max_lora_bytes=max_lora_bytes,
        )
        slots = self._device.tensors
        self._cpu = CpuTier(
            spec,
            max_cpu_loras=max_cpu_loras,
            max_lora_rank=max_lora_rank,
            stack_dtype=slots.stack_dtype,
            pin_memory=slots.device.type == "cuda",
            book=book if book is not None else IdentityBook(),
            choose_victim=choose_victim,
            strict_base_model=strict_base_model,
            max_cpu_lora_bytes=max_cpu_lora_bytes,
        )
        self.slot_budget = self._device.budget
        self.cpu_budget = self._cpu.budget
        self._usage = UsageBook()
        self._lock = threading.RLock()

    # -- device slot tensors, for the engine's LoRA layers ------------------------------
    @property
    def slot_tensors(self) -> DeviceSlots:
        """The device slots' stacked tensors alone (no lock, no tiers): what a forward pass
        reads. Their storage never moves; a slot is written only while no running sequence
        uses it."""
        return self._device.tensors

    @property
    def scales(self) -> torch.Tensor:
        """``[max_loras]`` scale per slot (0 for an empty slot)."""
        return self._device.tensors.scales

    @property
    def effective_rank(self) -> int:
        """Largest rank among resident adapters; columns past it are zero in every slot."""
        with self._lock:
            return self._device.effective_rank

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
        vouched = self._cpu.book.entry(request.lora_path)
        vouched = vouched if vouched is not None and vouched[1] == identity else None
        fresh, seconds = self._read(request, vouched)
        with self._lock:
            return self._cpu_entry(request, identity, fresh, seconds, admitted=True)

    def in_slot(self, identity: WeightsIdentity) -> bool:
        with self._lock:
            return identity in self._device.slot_of

    def in_memory(self, identity: WeightsIdentity) -> bool:
        """Whether ``identity``'s weights are in the CPU tier or a device slot, so that
        ``acquire`` needs no file."""
        with self._lock:
            return identity in self._cpu or identity in self._device.slot_of

    def hold(self, identity: WeightsIdentity) -> None:
        """A request was admitted under ``identity``: keep weights no file gives any more."""
        with self._lock:
            self._cpu.hold(identity)

    def release(self, identity: WeightsIdentity) -> None:
        """A request admitted under ``identity`` ended."""
        with self._lock:
            self._cpu.release(identity)

    def pin(self, request: LoRARequest, pinned: bool = True) -> None:
        """Mark ``request``'s adapter directory pinned (or not): eviction candidates say so,
        and the built-in policy evicts pinned adapters last."""
        with self._lock:
            self._usage.pin(request.lora_path, pinned)

    # -- device tier ------------------------------------------------------------------
    def slot_of(self, request: LoRARequest) -> int | None:
        """The slot holding the weights ``request``'s files had when last hashed, if any."""
        with self._lock:
            return self._device.slot_of.get(self._cpu.book.last(request.lora_path))

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
            device = self._device
            slot = device.slot_of.get(identity)
            if slot is not None:
                device.hit()
                self._usage.touch(identity, request, used=True, tenant=tenant)
                return slot
            if not read_files and identity not in self._cpu:
                raise AdapterNotInMemory(f"adapter {request.lora_name!r}: {identity}")
            adapter = self._cpu.get(identity)
            if adapter is None and fresh is not None and fresh.identity == identity:
                adapter = fresh
            read = adapter is None
            if read:  # read (or refused) only once a slot could be had
                if device.all_busy(busy_slots):
                    device.wait()
                    return None
                adapter = self._cpu_entry(request, identity, fresh, seconds, admitted=True)
            size = device.size_of(adapter)
            victims = device.victims(busy_slots, size, self._usage)
            if victims is None:
                device.wait()
                return None
            if not read:
                adapter = self._cpu_entry(request, identity, fresh, seconds, admitted=True)
            slot = device.replace(victims, identity, adapter, size)
            for victim in victims:
                self._forget_usage_if_gone(victim)
            self._usage.touch(identity, request, used=True, tenant=tenant)
            return slot

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
            return self._cpu.room_to_load(loading)

    def known_identity(self, request: LoRARequest) -> WeightsIdentity | None:
        """The identity of ``request``'s files when a stat vouches for them (unchanged since
        read), whether or not their weights are still in memory: admitting a request under it
        reads no file, and where the weights left memory the request's own load reads them
        once the tier has room (``room_to_load``)."""
        identity = self._cpu.book.known(request.lora_path)
        with self._lock:
            if identity is not None and identity in self._cpu:
                self._usage.touch(identity, request, used=False)
        return identity

    def _resolve(self, request: LoRARequest) -> tuple[WeightsIdentity, LoRAAdapter | None, float]:
        """The identity of ``request``'s files now: from a stat when they are unchanged since
        read, otherwise by reading them (the adapter read is returned too; files a store's
        check vouched for and still so stamped are not hashed again). No lock held."""
        identity = self._cpu.book.known(request.lora_path)
        if identity is not None:
            return identity, None, 0.0
        adapter, seconds = self._read(request, self._cpu.book.entry(request.lora_path))
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
        adapter = self._cpu.hit(identity)
        if adapter is not None:
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
            adapter = self._cpu.hit(identity)
            if adapter is not None:
                return adapter
        evicted = self._cpu.insert(
            identity, request, fresh, seconds, self._usage, self._device.slot_of, admitted
        )
        for victim in evicted:
            self._forget_usage_if_gone(victim)
        return fresh

    def _read(
        self, request: LoRARequest, vouched: Vouch | None = None
    ) -> tuple[LoRAAdapter, float]:
        started = time.perf_counter()
        with self.load_pacing.loading():
            adapter = self._cpu.read(request, vouched, self.load_pacing)
            # Larger than a whole tier: refused before anything remembers it.
            self._device.take_in(request.lora_name, adapter, self.load_pacing)
        self._cpu.book.record(request.lora_path, adapter.stamp, adapter.identity, request.lora_name)
        with self._lock:
            self._cpu.count_read(vouched_identity(adapter.stamp, vouched) is not None)
        return adapter, time.perf_counter() - started

    # -- both tiers -------------------------------------------------------------------
    def remove(self, request: LoRARequest, busy_slots=frozenset()) -> bool:
        """Forget the weights ``request`` used in every tier (their slots are zeroed); True if
        any were cached. Weights an admitted request still needs stay in the CPU tier.

        Raises ValueError, changing nothing, if one of their slots is in ``busy_slots``.
        """
        with self._lock:
            current = self._cpu.book.last(request.lora_path)
            identities = {i for i, u in self._usage.entries.items() if u.request == request}
            if current is not None and (current in self._cpu or current in self._device.slot_of):
                identities.add(current)
            for identity in identities:
                slot = self._device.slot_of.get(identity)
                if slot is not None and slot in busy_slots:
                    raise ValueError(
                        f"adapter {request.lora_name!r} is in slot {slot}, which running "
                        "sequences use"
                    )
            found = False
            for identity in identities:
                found |= self._cpu.drop(identity)
                found |= self._device.clear(identity) is not None
                self._forget_usage_if_gone(identity)
            return found

    def _forget_usage_if_gone(self, identity: WeightsIdentity) -> None:
        kept = identity in self._cpu or identity in self._device.slot_of
        self._usage.forget_unless(identity, kept)

    # -- what it reports ----------------------------------------------------------------
    def stats(self) -> dict[str, float]:
        with self._lock:
            return tier_reports.tier_stats(self._cpu, self._device)

    def tiers(self) -> dict[str, str]:
        """Each weights sha256 in memory: "device" (in a slot) or "cpu"."""
        with self._lock:
            return tier_reports.tier_of_weights(self._cpu, self._device)

    def loads(self) -> dict[str, tuple]:
        """Each weights sha256 ever loaded: (disk loads, seconds, slot loads, seconds)."""
        with self._lock:
            return tier_reports.tier_loads(self._cpu, self._device)

    def cpu_resident(self) -> list[LoRARequest]:
        """The request that last used each CPU-tier entry, least recently used first."""
        with self._lock:
            return tier_reports.cpu_resident(self._cpu, self._usage)
