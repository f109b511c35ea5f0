"""One engine replica: a Ray Serve deployment holding an AsyncLLMEngine with its own tiers.

Requests name their adapter as the multiplexed model id, so Ray Serve routes them to a
replica that already holds it; the replica's multiplexed LRU (`max_cpu_loras` ids: the
adapters it keeps in memory, its device slots a smaller cache within) is what Ray Serve
knows of it. Loading an id reads the adapter from the registry's
path into the CPU tier on first use; when Ray Serve's LRU drops an id, the replica drops
its weights too (Ray Serve routes it elsewhere now, so keeping them would only hold memory),
unless requests still run on it (then the engine's own LRU evicts them later).

Adapters kept in the adapter store (uploads, sources by URI) reach the replica as
`adapter-store:<object id>` paths: its engine's adapter residency fetches them by hash into
the replica's own `--adapter-cache-dir` (`{replica}` in it: this replica's id), checked
before use, so nothing but the store is shared with the ingress.

A replica runs as many torch threads as it has CPUs (whole ones, at least one), set before
its engine starts: Ray puts that count in `OMP_NUM_THREADS`, but only once the actor is
placed, and a worker that loaded torch before (a setup hook, a prestarted worker) keeps
OpenMP's default of one thread per core. Two replicas of half a CPU each on 2 cores then ran
two threads each, and their steps took 10x as long (the fleet check run, 2026-11-27).

Every exception of a call comes back as a `Failure` value (the ingress re-raises it as
itself). The replica reports its state to the board every `report_every_s` and applies
the retirements it hears of there.
"""

from __future__ import annotations

import asyncio
import logging
import math

import ray
import torch
from ray import serve

from loragate.adapters import LoRARequest
from loragate.engine import AsyncLLMEngine, EngineConfig, EngineRequest
from loragate.gateway.adapter_control.adapter_store_setup import adapter_fetcher
from loragate.gateway.replicas.wire import AdapterSummary, Failure, ReplicaReport

log = logging.getLogger(__name__)

# How often a replica drops its cached copies of adapter store objects deleted meanwhile.
PRUNE_EVERY_S = 600.0


def torch_threads(cpus: float | None) -> int:
    """The torch threads of a replica given ``cpus`` CPUs (None: as torch has now)."""
    return torch.get_num_threads() if cpus is None else max(1, math.floor(cpus))


class _Resident:
    """Ray Serve's handle on one adapter id in this replica's multiplexed LRU. Ray Serve
    calls `__del__` when its LRU drops the id (on a worker thread); the replica then drops
    the weights too, since Ray Serve no longer routes the adapter here. Idempotent: the
    garbage collector calls it again later."""

    def __init__(self, replica: EngineReplica, name: str, lora: LoRARequest):
        self._replica, self.name, self.lora = replica, name, lora
        self._dropped = False
        replica.held.add(name)

    def __del__(self):
        if not self._dropped:
            self._dropped = True
            self._replica.dropped(self)


class EngineReplica:
    """The deployment's class: Ray Serve makes one per replica, each in its own actor."""

    def __init__(
        self,
        config: EngineConfig,
        adapter_load_timeout: float,
        board_name: str,
        board_namespace: str,
        report_every_s: float = 0.25,
        adapter_store: str | None = None,
        adapter_cache_dir: str | None = None,
    ):
        context = serve.get_replica_context()
        self.replica_id = context.replica_id.unique_id
        # Before the engine's threads start: they take torch's count when they first run.
        torch.set_num_threads(
            torch_threads(ray.get_runtime_context().get_assigned_resources().get("CPU"))
        )
        # Adapters uploaded to the store are fetched by hash into this replica's own cache;
        # from here on the replica talks to its engine alone.
        fetcher = None
        if adapter_cache_dir is not None:
            fetcher = adapter_fetcher(adapter_store, adapter_cache_dir, self.replica_id)
        self.engine = AsyncLLMEngine.from_config(config, adapter_load_timeout, fetcher)
        self.actor_name = ray.get_runtime_context().get_actor_name() or ""
        self.node = ray.get_runtime_context().get_node_id()
        self.board = ray.get_actor(board_name, namespace=board_namespace)
        # The LoRARequest last asked for under each multiplexed id (kept, not popped: Ray
        # Serve may call `load` for one id from two overlapping requests).
        self._wanted: dict[str, LoRARequest] = {}
        self.held: set[str] = set()  # the ids in Ray Serve's LRU here
        self._loop = asyncio.get_running_loop()
        in_memory = self.engine.model_info.max_cpu_loras if config.enable_lora else 1

        async def load(model_id: str) -> _Resident:
            lora = self._wanted[model_id]
            await self.engine.add_adapter(lora)
            return _Resident(self, model_id, lora)

        self._resident = serve.multiplexed(max_num_models_per_replica=in_memory)(load)
        self._reporter = self._loop.create_task(self._report_loop(report_every_s))
        self._pruner = None
        if fetcher is not None:
            self._pruner = self._loop.create_task(self._prune_loop(PRUNE_EVERY_S))

    # ---- what the ingress calls ----------------------------------------------------------
    async def generate(self, request: EngineRequest):
        """Stream the request's outputs; a cancelled stream (client gone) aborts it."""
        try:
            if request.lora_request is not None:
                await self._make_resident(request.lora_request)
            async for out in self.engine.generate_request(request):
                yield out
        except Exception as exc:  # noqa: BLE001 - every failure goes back as itself
            yield Failure(exc)

    async def add_adapter(self, lora: LoRARequest, timeout: float | None) -> AdapterSummary:
        """Read and validate the adapter here, where Ray Serve routes its name from now on
        (registration is its first use, so affinity starts with it). Validated first: Ray
        Serve's LRU makes room before it loads, and a bad adapter must not evict a good one."""
        try:
            adapter = await self.engine.add_adapter(lora, timeout=timeout)
            if serve.get_multiplexed_model_id():
                await self._make_resident(lora)
        except Exception as exc:  # noqa: BLE001
            return Failure(exc)
        return AdapterSummary(
            rank=adapter.rank,
            alpha=float(adapter.alpha),
            target_modules=tuple(sorted(adapter.target_modules)),
            sha256=adapter.sha256,
            size_bytes=adapter.size_bytes,
            kind=adapter.kind,
        )

    async def model_info(self):
        """What the ingress needs to serve this model: its ModelInfo and prompt processor."""
        return self.engine.model_info, self.engine.prompt_processor

    async def check_health(self) -> None:
        """Ray Serve's health check: a replica whose engine died is replaced."""
        if not self.engine.is_running:
            raise RuntimeError(f"the engine is not running: {self.engine.dead_error}")

    # ---- inside -------------------------------------------------------------------------
    async def _make_resident(self, lora: LoRARequest) -> None:
        model_id = serve.get_multiplexed_model_id() or lora.lora_name
        self._wanted[model_id] = lora
        await self._resident(model_id)

    def dropped(self, resident: _Resident) -> None:
        """Ray Serve's LRU dropped an adapter id (from any thread): drop its weights."""
        self.held.discard(resident.name)
        if not self._loop.is_closed():
            asyncio.run_coroutine_threadsafe(self._remove(resident.lora), self._loop)

    async def _remove(self, lora: LoRARequest) -> None:
        try:
            await self.engine.remove_adapter(lora)
        except ValueError:  # still running: the engine's own LRU evicts it later
            pass
        except Exception:  # noqa: BLE001 - the engine is stopping; nothing to free
            log.debug("dropping adapter %s failed", lora.lora_name, exc_info=True)

    async def _report_loop(self, every_s: float) -> None:
        while True:
            try:
                await self._report_once()
            except Exception:  # noqa: BLE001 - the board may be restarting; report later
                log.debug("reporting to the board failed", exc_info=True)
            await asyncio.sleep(every_s)

    async def _report_once(self) -> None:
        stats = await self.engine.stats()
        report = ReplicaReport(
            replica=self.replica_id,
            actor_name=self.actor_name,
            stats=stats,
            multiplexed=tuple(sorted(self.held)),
            store_fetches=stats.adapter_store_fetches,
            node=self.node,
            torch_threads=torch.get_num_threads(),
        )
        for lora in await self.board.report.remote(report):
            await self._remove(lora)

    async def _prune_loop(self, every_s: float) -> None:
        """Drop cached copies of adapter store objects deleted since (their names are gone)."""
        while True:
            await asyncio.sleep(every_s)
            try:
                gone = await self.engine.prune_adapter_objects()
                if gone:
                    log.info("dropped %d cached adapters the store no longer holds", len(gone))
            except Exception:  # noqa: BLE001 - the store may be unreachable; try later
                log.debug("pruning the adapter cache failed", exc_info=True)

    def __del__(self):
        if self._pruner is not None:
            self._pruner.cancel()
        self._reporter.cancel()
        self.engine.shutdown()
