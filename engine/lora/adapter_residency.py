"""An adapter's weights in the engine, one owner: admission, holds, loads, slots, the
requests in flight per adapter, and events when the weights behind a name change.

A request naming an adapter is admitted under the weights its files hold then (resolved once:
a stat when a loader read them already, otherwise a read), and holds them until it ends, so
files changed in place never swap weights under it. Weights come into memory on loader
threads, never on the engine's step.

The scheduler takes a device slot only for weights already in memory (the CPU tier or a
slot). A request whose weights are not there waits in the queue while a loader thread reads
them, and every other request keeps running; the next step that finds them in memory
schedules it. A load that fails fails the requests waiting for those weights, with the
adapter's own error (AdapterChangedError when the files now hold other weights). A load
starts only while the CPU tier has room beside the weights admitted requests hold, which
never leave it for another request's load: a burst over more distinct adapters than the
tier holds is read once each, in turn, where evicting waiting requests' weights for each
other's loads read them many times over (the fleet check run found 1542 disk loads for 240
requests).

Weights in CPU memory come into a device slot on the step that admits their request: at
most one adapter per step, and its request runs in that step, so a burst spreads them over
as many steps. On a GPU that is a copy, run a layer at a time on a side stream beside
the admitting step's forward, which waits for each layer's copy only where it reads it
(adapters/slot_copies.py). On a CPU the slot borrows the CPU tier's rows in
place (adapters/slots.py): pointing the layers' LoRA groups at them takes about 3 ms where
copying a rank-64 adapter on every projection took 7-30 ms (float32, 2 cores). (Copying on
a loader thread instead, into a free slot, was measured and made the running streams' worst
gap larger, 1.7-3.7x their median against 1.5-1.8x: the copy fights the step for the same
two cores and memory bus, at a moment the step cannot choose.)
Requests in flight per adapter (engine/lora/adapter_in_flight.py) count from the moment the
async engine is handed one until it ends, so a server removes an adapter only once nothing
uses it; changed weights behind a name are announced to listeners (engine/lora/adapter_events.py).
An adapter named by its adapter store object is fetched by hash here, before it is read
(engine/lora/stored_adapters.py), and its first read takes the fetch's word for the hash of files
unchanged since it checked them.

The tiers are plain objects this one owns and builds: the CPU tier (adapters/cpu_tier.py:
weights by content, their bytes and holds, reads through the engine's IdentityBook) and the
device tier (adapters/device_tier.py: slots, their tensors, victims chosen by the eviction
plugin), with the usage both describe to the plugin (adapters/usage.py), all under this
object's one lock; it is the only writer of the holds. Nobody else holds a tier: the
scheduler, the runner, the CUDA graphs, the stats and the async engine each ask this object
(tests/engine/test_adapter_ownership.py checks it).

Both tiers are keyed by the weights' content (``WeightsIdentity``, adapters/identity.py),
never by a request's name, id or path: files that change are new entries everywhere, and two
names (or two int ids) with the same files share one entry. Each tier holds at most its count
of adapters and its byte budget (adapters/tier_budget.py): an adapter with whole embedding or
output matrices takes the room of several plain ones, eviction frees as much as a newcomer
needs, and one larger than a whole tier is refused (AdapterTooLargeError) when it is read.
Weights an admitted request still needs and that its files no longer hold never leave the
CPU tier, even past max_cpu_loras, until those requests end; slots running sequences use are
never evicted. ``counts()`` names the tiers' counters (adapters/tier_reports.py).

Loader threads run at normal priority: a lower one (nice) lets the machine's other
work starve a loader that holds the GIL, and the step then waits on it (seconds, measured on
two busy cores).
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait

import torch

from loragate.adapters import (
    AdapterChangedError,
    AdapterLoadTimeoutError,
    AdapterNotInMemory,
    LoadPacing,
    LoadWindows,
    LoRAAdapter,
    LoRAModelSpec,
    LoRARequest,
    WeightsIdentity,
    tier_reports,
)
from loragate.adapters.cpu_tier import CpuTier
from loragate.adapters.device_tier import DeviceTier
from loragate.adapters.eviction import ChooseVictim, lru_victim
from loragate.adapters.identity import SYSTEM_CLOCK, IdentityBook, StampClock, Vouch
from loragate.adapters.loader import vouched_identity
from loragate.adapters.pacing import ALWAYS_PACED
from loragate.adapters.slots import DeviceSlots
from loragate.adapters.store import AdapterFetcher
from loragate.adapters.tier_budget import TierBudget
from loragate.adapters.usage import UsageBook
from loragate.engine.api.config import EngineConfig
from loragate.engine.api.thread_bridge import drop_result
from loragate.engine.core.sequence import Request
from loragate.engine.lora.adapter_events import AdapterEvents, WeightsListener
from loragate.engine.lora.adapter_in_flight import InFlightRequests
from loragate.engine.lora.stored_adapters import StoredAdapters
from loragate.kernels import use_one_thread

# Loads run beside the engine's step, each paced to about a ninth of a core
# (adapters/pacing.py). Two keep a burst of cold adapters moving on a machine with cores to
# spare; on a small one the second costs the steps more than it gives the loads. Measured on
# a 2-core AMD EPYC (2026-11-27, float32, 8 base and 2 rank-64 LoRA rows decoding while
# rank-64 adapters on every projection load without end): the median step 59-61 ms alone,
# 59-70 beside one loader (0.6 loads/s), 77-86 beside two (1.0 loads/s).
CORES_PER_LOADER = 4
MAX_LOADER_THREADS = 2


def loader_threads(cores: int) -> int:
    """How many adapter loads run at once on a machine with ``cores`` usable cores."""
    return max(1, min(MAX_LOADER_THREADS, cores // CORES_PER_LOADER))


def usable_cores() -> int:
    """The cores this process may run on (its affinity, where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


LOADER_THREADS = loader_threads(usable_cores())


class AdapterNotReady(Exception):
    """A request's adapter cannot take a slot this step (its weights are loading, or this
    step already copied an adapter into a slot); it waits without holding up the others."""


def loader_pool(workers: int, name: str) -> ThreadPoolExecutor:
    """Threads that read adapter files. Their torch ops run on the thread itself: an OpenMP
    pool of their own would slow every parallel region of the step (kernels/omp_runtime.py)."""
    return ThreadPoolExecutor(workers, thread_name_prefix=name, initializer=use_one_thread)


class AdapterResidency:
    """The engine's one owner of adapter weights: the CPU and device tiers and the usage
    they describe to the eviction plugin, under one lock; the one loader pool; what a
    request is admitted under and the holds that keep those weights until it ends; the
    scheduler's door to the device slots; the requests in flight per adapter; the events
    when a name's weights change; and fetching adapter store objects by hash.

    ``book`` is the engine's IdentityBook (adapters/identity.py): what its reads hashed, and
    what the adapter store's checks vouch for, which its reads take the word of; its clock
    stamps the reads. Without one the residency keeps a book of its own. ``remove`` refuses
    (ValueError) to drop an adapter whose slot is in the busy_slots it is given; the engine
    passes the slots its running sequences use, as for ``acquire``. Every method is
    thread-safe; reads of files hold no lock."""

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
        workers: int = LOADER_THREADS,
        fetcher: AdapterFetcher | None = None,
    ):
        self.spec = spec
        self.load_pacing = load_pacing  # the engine's: paced only while its steps run
        # the turns between steps its loads take (the pacing lends them)
        self.windows = load_pacing.windows or LoadWindows()
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
        self._usage = UsageBook()
        self._in_flight = InFlightRequests()
        self._events = AdapterEvents()
        self._stored = StoredAdapters(fetcher)
        self._workers = workers
        self._pool = loader_pool(workers, "loragate-adapter-load")
        self._loads: dict[WeightsIdentity, Future] = {}
        self._lock = threading.RLock()  # the tiers, the usage, the loads
        self._copied_this_step = False

    # ---- requests in flight (any thread) ------------------------------------------------
    def started(self, lora: LoRARequest) -> None:
        """A request for ``lora`` was handed to the engine: in flight until `ended`."""
        self._in_flight.started(lora)

    def ended(self, lora: LoRARequest) -> None:
        """A request for ``lora`` ended, however it ended; once for each `started`."""
        self._in_flight.ended(lora)

    def in_flight(self, lora: LoRARequest) -> int:
        """Requests for ``lora`` started and not yet ended."""
        return self._in_flight.count(lora)

    def in_flight_by_name(self) -> dict[str, int]:
        """Requests in flight per adapter name, for every adapter that has any."""
        return self._in_flight.by_name()

    async def wait_idle(self, lora: LoRARequest) -> None:
        """Return once no request for ``lora`` is in flight."""
        await self._in_flight.wait_idle(lora)

    # ---- weights changed behind a name (the requests' event loop) -----------------------
    def subscribe(self, listener: WeightsListener) -> Callable[[], None]:
        """Tell ``listener`` each time a name's admitted weights change; call what this
        returns to stop (engine/lora/adapter_events.py)."""
        return self._events.subscribe(listener)

    async def settled(self, lora: LoRARequest) -> None:
        """Return once the listeners told of a change under ``lora``'s name are done."""
        await self._events.settled(lora)

    # ---- admission from the event loop (the async engine's way) ------------------------
    async def admit_request(
        self, lora: LoRARequest, timeout: float
    ) -> tuple[LoRARequest, WeightsIdentity]:
        """For a request naming ``lora``, on the event loop: the LoRARequest the engine runs
        it with (a store object's verified local directory, fetched by hash if need be) and
        the weights it is admitted under (one stat when its files are unchanged since read,
        whether or not the weights are still in memory; else read and validated on a loader
        thread within ``timeout`` s). Announces weights changed behind the name.
        AdapterError for a bad adapter, AdapterStoreError for an object the store cannot
        give, AdapterLoadTimeoutError past ``timeout``."""
        local = await self.fetched(lora)
        identity = self.known_identity(local)
        if identity is None:
            identity = (await self.read(local, timeout)).identity
        self._stored.check(lora, identity)
        self._events.admitted(lora, identity.sha256)
        return local, identity

    async def fetched(self, lora: LoRARequest) -> LoRARequest:
        """``lora`` as the engine reads it: a store object's verified local directory,
        fetched on a thread of its own (a download may take long; it never holds up a load)."""
        ready = self._stored.ready(lora)
        if ready is not None:
            return ready
        return await asyncio.get_running_loop().run_in_executor(None, self._stored.fetch, lora)

    async def read(self, lora: LoRARequest, timeout: float) -> LoRAAdapter:
        """Read and validate ``lora``'s files into the CPU tier on a loader thread (one stat
        when unchanged since read; a fetched store object's, not hashed again when unchanged
        since its fetch checked them): its LoRAAdapter. AdapterLoadTimeoutError past
        ``timeout`` seconds (the read goes on, and its result is kept)."""
        work = asyncio.wrap_future(self._pool.submit(self.preload, lora))
        try:
            return await asyncio.wait_for(asyncio.shield(work), timeout)
        except TimeoutError as exc:
            work.add_done_callback(drop_result)
            raise AdapterLoadTimeoutError(
                f"reading and validating the adapter took longer than {timeout:g} s"
            ) from exc

    def admit(
        self, lora_request: LoRARequest, identity: WeightsIdentity | None
    ) -> tuple[LoRARequest, WeightsIdentity]:
        """The LoRARequest a request naming ``lora_request`` runs with and its weights:
        both as given when a loader resolved them already (the async engine's way),
        otherwise, on this thread (the offline engine's way), a store object's verified
        local directory, fetched if need be, and the files as they are now (one stat when
        unchanged since read). AdapterError for a bad adapter, AdapterStoreError for an
        object the store cannot give."""
        if identity is not None:
            return lora_request, identity
        local = self._stored.fetch(lora_request)
        identity = self.admission_identity(local)
        self._stored.check(lora_request, identity)
        return local, identity

    def hold(self, request: Request) -> None:
        """``request`` was admitted: its weights stay loadable until it ends, and start
        loading now unless they are in memory (or wait for room: `start`)."""
        self.hold_weights(request.adapter_identity)
        self.start(request)

    def release(self, request: Request) -> None:
        """``request`` ended: its weights may age out."""
        self.release_weights(request.adapter_identity)

    def new_step(self) -> None:
        """The engine starts a step: one adapter may be copied into a slot again."""
        self._copied_this_step = False

    def step_took(self, seconds: float) -> None:
        """A step ran ``seconds`` of its own work (no window in it): the windows' measure."""
        self.windows.observe(seconds)

    def lend_window(self) -> float:
        """Between scheduling a step and running it, where a load beside the steps waits
        for its turn: the machine is the loads' for a share of the median step
        (adapters/pacing.py's LoadWindows). Not before a step that copies an adapter into a
        slot: that step runs its request's first prompt tokens and LoRA rows and is already
        the longest the streams see (issue 47's join step, 1.5-1.7x their median on 2
        cores); a window before it would take their gap past twice the median. The seconds
        planned; 0 where none was lent."""
        if self._copied_this_step:
            return 0.0
        return self.windows.lend()

    def start(self, request: Request) -> None:
        """Begin reading ``request``'s admitted weights on a loader thread unless they are in
        memory or already on their way. A load starts only while a loader thread is free and
        the CPU tier has room beside the weights admitted requests hold; otherwise `acquire`
        starts it on a later step (the scheduler's order, not a queue's, picks the next)."""
        identity = request.adapter_identity
        with self._lock:
            if identity in self._loads or self.in_memory(identity):
                return
            loading = sum(not load.done() for load in self._loads.values())
            if loading >= self._workers or not self._cpu.room_to_load(loading):
                return
            self._loads[identity] = self._pool.submit(self.load, request.lora_request, identity)

    def acquire(self, request: Request, busy_slots) -> int | None:
        """The slot holding ``request``'s admitted weights; None while every slot is busy.

        Raises AdapterNotReady while they load and while another adapter takes this step's
        one copy into a slot; the load's error once it failed. Never reads a file. A request
        whose weights are copied into a slot here runs in this step.
        """
        identity = request.adapter_identity
        with self._lock:
            load = self._loads.get(identity)
            if load is not None and not load.done():
                raise AdapterNotReady("its weights are loading")
            if load is not None:
                del self._loads[identity]
                if load.exception() is not None:
                    raise load.exception()
        copies = not self.in_slot(identity)
        if copies and self._copied_this_step:
            raise AdapterNotReady("one adapter copy into a slot per step")
        try:
            slot = self.acquire_slot(
                request.lora_request,
                busy_slots,
                identity,
                tenant=request.tenant,
                read_files=False,
            )
        except AdapterNotInMemory as exc:
            self.start(request)
            raise AdapterNotReady(str(exc)) from exc
        if copies and slot is not None:
            self._copied_this_step = True  # it runs in this step; the next copy waits
        return slot

    @property
    def loading(self) -> bool:
        with self._lock:
            return any(not load.done() for load in self._loads.values())

    def wait(self, timeout: float) -> None:
        """Block until a load ends or ``timeout`` seconds pass (the engine has nothing else
        to run)."""
        with self._lock:
            pending = [load for load in self._loads.values() if not load.done()]
        if pending:
            wait(pending, timeout, return_when=FIRST_COMPLETED)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    # ---- what the engine thread asks ----------------------------------------------------
    def preload(self, lora: LoRARequest) -> LoRAAdapter:
        """The adapter ``lora``'s files hold now (a store object's fetched if need be), read
        and validated on this thread, and kept in the CPU tier unless the weights admitted
        requests hold fill it.

        Its ``identity`` is what a request is admitted under. Unchanged files cost one stat
        (no read, no hash); changed files are read, hashed and cached as a new entry, the
        old one left to age out. What the book says a store object's check hashed spares the
        hash of files still stamped as they were then (adapters/loader.py). An AdapterError
        leaves the tiers exactly as they were.
        """
        local = self._stored.fetch(lora)
        identity, fresh, seconds = self._resolve(local)
        with self._lock:
            adapter = self._cpu_entry(local, identity, fresh, seconds)
            if adapter.identity in self._cpu:  # not kept where held weights fill the tier
                self._usage.touch(adapter.identity, local, used=False)
            return adapter

    def remove(self, lora: LoRARequest, busy_slots=frozenset()) -> bool:
        """Forget the weights ``lora`` used in every tier (their slots are zeroed); True if
        any were cached. Weights an admitted request still needs stay in the CPU tier.
        ValueError, changing nothing, while running sequences use one of their slots
        (``busy_slots``)."""
        request = self._stored.as_fetched(lora)
        with self._lock:
            current = self._cpu.book.last(request.lora_path)
            identities = {i for i, u in self._usage.entries.items() if u.request == request}
            if current is not None and self._in_a_tier(current):
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

    def pin(self, lora: LoRARequest, pinned: bool = True) -> None:
        """Evict ``lora`` last (or, unpinned, as any other): eviction candidates say so, and
        the built-in policy evicts pinned adapters last."""
        path = self._stored.as_fetched(lora).lora_path
        with self._lock:
            self._usage.pin(path, pinned)

    # ---- the tiers: a request's weights, where they are (any thread) --------------------
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

    def admission_identity(self, request: LoRARequest) -> WeightsIdentity:
        """What a request naming ``request`` is admitted under: ``known_identity`` where a
        stat vouches for its files, otherwise read, validated and kept in the CPU tier where
        it has room beside the weights admitted requests hold (``preload``). An AdapterError
        leaves the tiers as they were."""
        identity = self.known_identity(request)
        return identity if identity is not None else self.preload(request).identity

    def hold_weights(self, identity: WeightsIdentity) -> None:
        """A request was admitted under ``identity``: keep weights no file gives any more."""
        with self._lock:
            self._cpu.hold(identity)

    def release_weights(self, identity: WeightsIdentity) -> None:
        """A request admitted under ``identity`` ended."""
        with self._lock:
            self._cpu.release(identity)

    def room_to_load(self, loading: int = 0) -> bool:
        """Whether weights may be read into the CPU tier for an admitted request now, with
        ``loading`` reads already under way: the tier has a place and bytes left beside the
        weights admitted requests hold, which never leave it for another load."""
        with self._lock:
            return self._cpu.room_to_load(loading)

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
        ``acquire_slot`` needs no file."""
        with self._lock:
            return self._in_a_tier(identity)

    def slot_of(self, request: LoRARequest) -> int | None:
        """The slot holding the weights ``request``'s files had when last hashed, if any."""
        with self._lock:
            return self._device.slot_of.get(self._cpu.book.last(request.lora_path))

    def acquire_slot(
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
        left memory), leaving the tiers unchanged. With ``read_files=False`` (the engine's
        step, through ``acquire``) weights in no memory tier raise AdapterNotInMemory
        instead of being read.
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
        weights raise AdapterChangedError instead of being served. Under the lock."""
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
        """``request``'s files read and validated, checked against both tiers' budgets and
        made ready for a slot (paced), then recorded in the book; the seconds it took."""
        started = time.perf_counter()
        with self.load_pacing.loading():
            adapter = self._cpu.read(request, vouched, self.load_pacing)
            # Larger than a whole tier: refused before anything remembers it.
            self._device.take_in(request.lora_name, adapter, self.load_pacing)
        self._cpu.book.record(request.lora_path, adapter.stamp, adapter.identity, request.lora_name)
        with self._lock:
            self._cpu.count_read(vouched_identity(adapter.stamp, vouched) is not None)
        return adapter, time.perf_counter() - started

    def _in_a_tier(self, identity: WeightsIdentity) -> bool:
        return identity in self._cpu or identity in self._device.slot_of

    def _forget_usage_if_gone(self, identity: WeightsIdentity) -> None:
        self._usage.forget_unless(identity, self._in_a_tier(identity))

    # ---- adapter store objects, as the gateway tells of them (blocking: a worker thread) --
    def adopt_object(self, oid: str, directory) -> None:
        """``directory``'s files were just written to the adapter store as ``oid``: cache
        them, so this engine does not download them again."""
        self._stored.adopt(oid, directory)

    def forget_object(self, oid: str) -> None:
        """The adapter store deleted ``oid``: drop its cached copy and what was checked of it."""
        self._stored.forget(oid)

    def prune_objects(self) -> list[str]:
        """Drop cached copies of objects the adapter store no longer holds; their ids."""
        return self._stored.prune()

    @property
    def store_fetches(self) -> int:
        """Adapter store objects downloaded into this engine's cache."""
        return self._stored.fetches

    # ---- what the runner and the CUDA graphs read: the device slots ---------------------
    @property
    def slot_tensors(self) -> DeviceSlots:
        """The device slots' stacked tensors alone (no lock, no tiers), as the LoRA kernels
        take them: what a forward pass reads. Their storage never moves; a slot is written
        only while no running sequence uses it."""
        return self._device.tensors

    @property
    def effective_rank(self) -> int:
        """Largest rank among resident adapters; columns past it are zero in every slot."""
        with self._lock:
            return self._device.effective_rank

    # ---- what the stats read (adapters/tier_reports.py) --------------------------------
    def counts(self) -> dict[str, float]:
        """The tiers' counters (adapters per tier, loads, evictions, held weights)."""
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

    @property
    def cpu_budget(self) -> TierBudget:
        """The CPU tier's limits (its count and bytes)."""
        return self._cpu.budget


def make_adapter_residency(
    spec: LoRAModelSpec,
    config: EngineConfig,
    plugins,
    model,
    steps_running: Callable[[], bool],
    fetcher: AdapterFetcher | None = None,
    stamp_clock: StampClock = SYSTEM_CLOCK,
) -> AdapterResidency:
    """The engine's adapter residency with slots on the model's device and dtype, eviction
    by plugin, and loads paced only while `steps_running()` (adapters/pacing.py); adapter
    store objects fetched with ``fetcher``. The engine keeps one IdentityBook
    (adapters/identity.py): the fetcher's, where its checks vouch for what they hashed, which
    the reads take the word of; else one of its own. The adapter files' stamps are taken at
    its clock: ``stamp_clock``, which must then be the fetcher book's."""
    return AdapterResidency(
        spec,
        max_loras=config.max_loras,
        max_lora_rank=config.max_lora_rank,
        max_cpu_loras=config.max_cpu_loras,
        max_lora_bytes=config.max_lora_bytes,
        max_cpu_lora_bytes=config.max_cpu_lora_bytes,
        device=model.device,
        dtype=model.dtype,
        strict_base_model=config.strict_lora_base_model,
        choose_victim=plugins.choose_adapter_victim,
        load_pacing=LoadPacing(
            busy=steps_running, windows=LoadWindows(share=config.adapter_load_window_share)
        ),
        book=identity_book(fetcher, stamp_clock),
        fetcher=fetcher,
    )


def identity_book(fetcher: AdapterFetcher | None, stamp_clock: StampClock) -> IdentityBook:
    """The engine's one IdentityBook: ``fetcher``'s (its checks write there), else a new one
    stamping at ``stamp_clock``. ValueError for a fetcher whose book stamps at another clock
    than a ``stamp_clock`` given."""
    if fetcher is None:
        return IdentityBook(stamp_clock)
    if stamp_clock is not SYSTEM_CLOCK and stamp_clock is not fetcher.book.clock:
        raise ValueError(
            "stamp_clock: an engine given an adapter fetcher stamps adapter files at the "
            "clock of the fetcher's IdentityBook; give the fetcher a book with this clock"
        )
    return fetcher.book


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return value
