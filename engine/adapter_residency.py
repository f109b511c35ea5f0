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
adapter's own error (AdapterChangedError when the files now hold other weights).

Weights in CPU memory come into a device slot on the step that admits their request: at
most one adapter per step, and its request runs in that step, so a burst spreads them over
as many steps. On a GPU that is a copy. On a CPU the slot borrows the CPU tier's rows in
place (adapters/slots.py): pointing the layers' LoRA groups at them takes about 3 ms where
copying a rank-64 adapter on every projection took 7-30 ms (float32, 2 cores). (Copying on
a loader thread instead, into a free slot, was measured and made the running streams' worst
gap larger, 1.7-3.7x their median against 1.5-1.8x: the copy fights the step for the same
two cores and memory bus, at a moment the step cannot choose.)
Requests in flight per adapter (engine/adapter_in_flight.py) count from the moment the
async engine is handed one until it ends, so a server removes an adapter only once nothing
uses it; changed weights behind a name are announced to listeners (engine/adapter_events.py).

Loader threads run at normal priority: a lower one (nice) lets the machine's other
work starve a loader that holds the GIL, and the step then waits on it (seconds, measured on
two busy cores).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait

from loragate.adapters import (
    AdapterCache,
    AdapterNotInMemory,
    LoadPacing,
    LoRAModelSpec,
    WeightsIdentity,
)
from loragate.engine.adapter_events import AdapterEvents
from loragate.engine.adapter_in_flight import InFlightRequests
from loragate.engine.config import EngineConfig
from loragate.engine.sequence import Request
from loragate.kernels import use_one_thread

# Loads run beside the engine's step; two keep a burst of cold adapters moving without
# taking every core from the forward pass.
LOADER_THREADS = 2


class AdapterNotReady(Exception):
    """A request's adapter cannot take a slot this step (its weights are loading, or this
    step already copied an adapter into a slot); it waits without holding up the others."""


def loader_pool(workers: int, name: str) -> ThreadPoolExecutor:
    """Threads that read adapter files. Their torch ops run on the thread itself: an OpenMP
    pool of their own would slow every parallel region of the step (kernels/omp_runtime.py)."""
    return ThreadPoolExecutor(workers, thread_name_prefix=name, initializer=use_one_thread)


class AdapterResidency:
    """The engine's one owner of adapter weights: what a request is admitted under, the
    holds that keep those weights until it ends, the loads on loader threads, the
    scheduler's door to the device slots, the requests in flight per adapter (`in_flight`)
    and the events when a name's weights change (`events`). The tiers themselves are the
    AdapterCache's."""

    def __init__(self, cache: AdapterCache, workers: int = LOADER_THREADS):
        self.cache = cache
        self.in_flight = InFlightRequests()
        self.events = AdapterEvents()
        self._pool = loader_pool(workers, "loragate-adapter-load")
        self._loads: dict[WeightsIdentity, Future] = {}
        self._lock = threading.Lock()
        self._copied_this_step = False

    def admit(self, lora_request, identity: WeightsIdentity | None) -> WeightsIdentity:
        """The weights a request naming ``lora_request`` runs with: ``identity`` when a
        loader resolved them already (the async engine's way), otherwise the files as they
        are now (one stat when unchanged since read). AdapterError for a bad adapter."""
        return identity or self.cache.preload(lora_request).identity

    def hold(self, request: Request) -> None:
        """``request`` was admitted: its weights stay loadable until it ends, and start
        loading now unless they are in memory."""
        self.cache.hold(request.adapter_identity)
        self.start(request)

    def release(self, request: Request) -> None:
        """``request`` ended: its weights may age out."""
        self.cache.release(request.adapter_identity)

    def new_step(self) -> None:
        """The engine starts a step: one adapter may be copied into a slot again."""
        self._copied_this_step = False

    def start(self, request: Request) -> None:
        """Begin reading ``request``'s admitted weights on a loader thread unless they are in
        memory or already on their way."""
        identity = request.adapter_identity
        with self._lock:
            if identity in self._loads or self.cache.in_memory(identity):
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


def make_adapter_cache(
    spec: LoRAModelSpec, config: EngineConfig, plugins, model, steps_running: Callable[[], bool]
) -> AdapterCache:
    """The engine's adapter cache: slots on the model's device and dtype, eviction by plugin,
    loads paced only while `steps_running()` (adapters/pacing.py)."""
    return AdapterCache(
        spec,
        max_loras=config.max_loras,
        max_lora_rank=config.max_lora_rank,
        max_cpu_loras=config.max_cpu_loras,
        device=model.device,
        dtype=model.dtype,
        strict_base_model=config.strict_lora_base_model,
        choose_victim=plugins.choose_adapter_victim,
        load_pacing=LoadPacing(busy=steps_running),
    )
