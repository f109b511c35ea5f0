"""The Ray side of `loragate serve --replicas N`: a Ray cluster (joined, or a local one
started and stopped with the server), the replicas' board, and the EngineReplica
deployment on Ray Serve; `start()` gives the ReplicatedEngine the ingress serves with.

Only Ray Serve's handles are used (no Serve HTTP proxy): the ingress is loragate's own app,
with its routes, auth, tenancy, quotas and metering against the shared registry.
"""

from __future__ import annotations

import logging
import os
from dataclasses import replace

from loragate.gateway.replicas.availability import require_ray_serve
from loragate.gateway.settings import GatewaySettings

log = logging.getLogger(__name__)

APP_NAME = "loragate"
DEPLOYMENT_NAME = "EngineReplica"
NAMESPACE = "loragate"
BOARD_NAME = "loragate-replica-board"
# A local cluster's shared-memory object store: outputs are small, so keep it small.
LOCAL_OBJECT_STORE_BYTES = 128 * 1024 * 1024


class RayReplicas:
    def __init__(
        self,
        settings: GatewaySettings,
        local_cpus: int | None = None,
        request_router: type | None = None,
        app_name: str = APP_NAME,
    ):
        """`request_router`: a Ray Serve RequestRouter class in place of its default
        (power of two choices, with multiplexed-id affinity); the benchmark's round robin.
        `app_name`: the Ray Serve application (a process keeps one router per name, so a
        deployment with another router needs another name)."""
        require_ray_serve()
        self.settings = settings
        self.app_name = app_name
        self.request_router = request_router
        self.local_cpus = local_cpus or os.cpu_count() or 1
        self.engine = None
        self._started_ray = False
        self._board = None

    def start(self):
        """Join or start Ray, deploy the replicas, and wait until they serve: the engine."""
        import ray
        from ray import serve
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from loragate.gateway.replicas.board import ReplicaBoard
        from loragate.gateway.replicas.engine_replica import EngineReplica
        from loragate.gateway.replicas.replicated_engine import ReplicatedEngine

        if not ray.is_initialized():
            self._init_ray(ray)
        serve.start(proxy_location="Disabled")
        # The board lives on the ingress's own node: an actor that asks for no CPU is
        # otherwise placed on any node, and a worker node lost would take it along (the
        # ingress then sees no replica, and new replicas, which look it up, never start).
        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        board_cls = ray.remote(num_cpus=0)(ReplicaBoard)
        self._board = board_cls.options(
            name=BOARD_NAME, namespace=NAMESPACE, get_if_exists=True, scheduling_strategy=here
        ).remote()
        settings = self.settings
        deployment = serve.deployment(EngineReplica).options(
            name=DEPLOYMENT_NAME,
            ray_actor_options={"num_cpus": settings.replica_cpus},
            max_ongoing_requests=settings.engine.max_num_seqs,
            graceful_shutdown_timeout_s=settings.shutdown_timeout,
            health_check_period_s=2,
            **self.scaling_options(),
            **self._router(),
        )
        app = deployment.bind(
            settings.engine,
            settings.adapter_load_timeout_seconds,
            BOARD_NAME,
            NAMESPACE,
            adapter_store=settings.adapter_store,
            adapter_cache_dir=str(settings.adapter_cache_dir),
        )
        log.info("deploying the engine replicas on Ray Serve (%s)", self.scaling_options())
        handle = serve.run(app, name=self.app_name, route_prefix=None)
        model_info, prompts = handle.model_info.remote().result()
        # The ingress admits what all replicas run at once (at most), not what one does.
        model_info = replace(
            model_info, max_num_seqs=model_info.max_num_seqs * self.most_replicas()
        )
        self.engine = ReplicatedEngine(handle, self._board, model_info, prompts)
        return self.engine

    def _router(self) -> dict:
        """The router given, else the spill rule's (unless --spill-at 0 turned it off)."""
        from ray.serve.config import RequestRouterConfig

        if self.request_router is not None:
            config = RequestRouterConfig(request_router_class=self.request_router)
        elif self.settings.spill_at != 0:
            from loragate.gateway.replicas.spill_router import SpillRouter

            config = RequestRouterConfig(
                request_router_class=SpillRouter, request_router_kwargs=self.spill_rule()
            )
        else:
            return {}
        return {"request_router_config": config}

    def spill_rule(self) -> dict:
        """The spill rule's thresholds: as given, else when a replica's batch is full, to a
        replica whose batch is at most half full (a flood spreads; affinity holds below)."""
        s = self.settings
        batch = s.engine.max_num_seqs
        if s.spill_at is not None:
            return {
                "spill_at": s.spill_at,
                "idle_at": 1 if s.spill_idle_at is None else s.spill_idle_at,
            }
        idle_at = batch // 2 if s.spill_idle_at is None else s.spill_idle_at
        return {"spill_at": batch, "idle_at": idle_at}

    @property
    def autoscaled(self) -> bool:
        return self.settings.min_replicas is not None or self.settings.max_replicas is not None

    def most_replicas(self) -> int:
        s = self.settings
        if not self.autoscaled:
            return s.replicas
        return s.max_replicas or max(s.min_replicas or 1, s.replicas or 1)

    def scaling_options(self) -> dict:
        """Ray Serve's options for a fixed number of replicas, or for autoscaling."""
        s = self.settings
        if not self.autoscaled:
            return {"num_replicas": s.replicas}
        low = s.min_replicas or 1
        config = {
            "min_replicas": low,
            "max_replicas": self.most_replicas(),
            "initial_replicas": s.replicas or low,
            "target_ongoing_requests": s.target_ongoing_requests,
        }
        timing = {
            "upscale_delay_s": s.upscale_delay_seconds,
            "downscale_delay_s": s.downscale_delay_seconds,
            "look_back_period_s": s.autoscaling_window_seconds,
        }
        config.update({k: v for k, v in timing.items() if v is not None})
        return {"autoscaling_config": config}

    def _init_ray(self, ray) -> None:
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # never phone home
        address = self.settings.ray_address
        if address is not None:
            log.info("joining the Ray cluster at %s", address)
            ray.init(address=address, namespace=NAMESPACE, log_to_driver=False)
            return
        log.info("starting a local Ray cluster (%d CPUs)", self.local_cpus)
        # "local": a cluster of its own, as ray_address's help says, never one that another
        # process on the machine started (ray.init alone joins the newest such cluster, and
        # refuses num_cpus there).
        ray.init(
            address="local",
            num_cpus=self.local_cpus,
            include_dashboard=False,
            object_store_memory=LOCAL_OBJECT_STORE_BYTES,
            log_to_driver=False,
            namespace=NAMESPACE,
        )
        self._started_ray = True

    def stop(self) -> None:
        """Drain and remove the replicas (each finishes its requests, up to the shutdown
        timeout), then stop the local cluster if this started it."""
        import ray
        from ray import serve

        if self.engine is not None:
            self.engine.shutdown()
        try:
            serve.delete(self.app_name)
            if self._started_ray:
                serve.shutdown()
            if self._board is not None:
                ray.kill(self._board)
        finally:
            if self._started_ray:
                ray.shutdown()
                self._started_ray = False
