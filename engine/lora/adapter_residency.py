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
unchanged since it checked them. Nobody else holds the AdapterCache: the scheduler, the runner,
the CUDA graphs, the stats and the async engine each ask this object
(tests/engine/test_adapter_ownership.py checks it).

Loader threads run at normal priority: a lower one (nice) lets the machine's other
work starve a loader that holds the GIL, and the step then waits on it (seconds, measured on
two busy cores).
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait

from loragate.adapters import (
    AdapterCache,
    AdapterLoadTimeoutError,
    AdapterNotInMemory,
    LoadPacing,
    LoadWindows,
    LoRAAdapter,
    LoRAModelSpec,
    LoRARequest,
    WeightsIdentity,
)
from loragate.adapters.identity import SYSTEM_CLOCK, IdentityBook, StampClock
from loragate.adapters.store import AdapterFetcher
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
    """The engine's one owner of adapter weights: the tiers (the AdapterCache, which only
    this object calls), the one loader pool, what a request is admitted under, the holds that
    keep those weights until it ends, the scheduler's door to the device slots, the
    requests in flight per adapter, the events when a name's weights change, and fetching
    adapter store objects by hash."""

    def __init__(
        self,
        cache: AdapterCache,
        workers: int = LOADER_THREADS,
        fetcher: AdapterFetcher | None = None,
    ):
        self.cache = cache  # read by tests; no engine or gateway module touches it
        # the turns between steps its loads take (the cache's pacing lends them)
        self.windows = cache.load_pacing.windows or LoadWindows()
        self._in_flight = InFlightRequests()
        self._events = AdapterEvents()
        self._stored = StoredAdapters(fetcher)
        self._workers = workers
        self._pool = loader_pool(workers, "loragate-adapter-load")
        self._loads: dict[WeightsIdentity, Future] = {}
        self._lock = threading.Lock()
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
        identity = self.cache.known_identity(local)
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
        work = asyncio.wrap_future(self._pool.submit(self.cache.preload, lora))
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
        identity = self.cache.admission_identity(local)
        self._stored.check(lora_request, identity)
        return local, identity

    def hold(self, request: Request) -> None:
        """``request`` was admitted: its weights stay loadable until it ends, and start
        loading now unless they are in memory (or wait for room: `start`)."""
        self.cache.hold(request.adapter_identity)
        self.start(request)

    def release(self, request: Request) -> None:
        """``request`` ended: its weights may age out."""
        self.cache.release(request.adapter_identity)

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
            if identity in self._loads or self.cache.in_memory(identity):
                return
            loading = sum(not load.done() for load in self._loads.values())
            if loading >= self._workers or not self.cache.room_to_load(loading):
                return
            self._loads[identity] = self._pool.submit(
                self.cache.load, request.lora_request, identity
            )

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
        copies = not self.cache.in_slot(identity)
        if copies and self._copied_this_step:
            raise AdapterNotReady("one adapter copy into a slot per step")
        try:
            slot = self.cache.acquire(
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
        """Read and validate ``lora``'s files into the CPU tier now, on this thread (the
        offline engine's way; one stat when unchanged since read)."""
        local = self._stored.fetch(lora)
        return self.cache.preload(local)

    def remove(self, lora: LoRARequest, busy_slots) -> bool:
        """Drop ``lora``'s weights from every tier; True if any were cached. ValueError,
        changing nothing, while running sequences use its slot."""
        return self.cache.remove(self._stored.as_fetched(lora), busy_slots)

    def pin(self, lora: LoRARequest, pinned: bool = True) -> None:
        """Evict ``lora`` last (or, unpinned, as any other)."""
        self.cache.pin(self._stored.as_fetched(lora), pinned)

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
    def slot_tensors(self):
        """The device slots' weights, as the LoRA kernels take them."""
        return self.cache.slot_tensors

    @property
    def max_loras(self) -> int:
        return self.cache.max_loras

    @property
    def max_lora_rank(self) -> int:
        return self.cache.max_lora_rank

    @property
    def effective_rank(self) -> int:
        """The largest rank resident in a slot now."""
        return self.cache.effective_rank

    # ---- what the stats read -----------------------------------------------------------
    def counts(self) -> dict:
        """The tiers' counters (adapters per tier, loads, evictions, held weights)."""
        return dict(self.cache.stats())

    def tiers(self) -> dict:
        return self.cache.tiers()

    def loads(self) -> dict:
        return self.cache.loads()


def make_adapter_residency(
    spec: LoRAModelSpec,
    config: EngineConfig,
    plugins,
    model,
    steps_running: Callable[[], bool],
    fetcher: AdapterFetcher | None = None,
    stamp_clock: StampClock = SYSTEM_CLOCK,
) -> AdapterResidency:
    """The engine's adapter residency over a cache with slots on the model's device and
    dtype, eviction by plugin, and loads paced only while `steps_running()`
    (adapters/pacing.py); adapter store objects fetched with ``fetcher``. The engine keeps
    one IdentityBook (adapters/identity.py): the fetcher's, where its checks vouch for what
    they hashed, which the cache reads with; else one of its own. The adapter files' stamps
    are taken at its clock: ``stamp_clock``, which must then be the fetcher book's."""
    return AdapterResidency(
        _adapter_cache(
            spec, config, plugins, model, steps_running, identity_book(fetcher, stamp_clock)
        ),
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


def _adapter_cache(spec, config, plugins, model, steps_running, book) -> AdapterCache:
    return AdapterCache(
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
        book=book,
    )
