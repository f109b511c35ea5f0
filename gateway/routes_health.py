"""GET /health (load balancers; no key needed) and GET /metrics (Prometheus).

/health is 200 while the engine runs: "ok", or "degraded" while the registry store is
unreachable (or lost its data and the replica serves what it knew), with the details
under `registry`. It is 503 once the engine has died.
"""

from __future__ import annotations

from litestar import Controller, Response, get

from loragate.gateway.metrics import CONTENT_TYPE
from loragate.gateway.schemas_admin import HealthStatus, RegistryHealth
from loragate.gateway.service import GatewayService, Service


class HealthController(Controller):
    path = "/"
    tags = ["Operations"]

    @get("/health", summary="200 while the engine runs (ok or degraded), 503 once it has died")
    async def health(self, service: Service) -> Response[HealthStatus]:
        engine = service.engine
        registry, problem = registry_health(service)
        if engine.is_running:
            status = "degraded" if problem else "ok"
            return Response(
                HealthStatus(
                    status=status, model=service.model_name, detail=problem, registry=registry
                )
            )
        detail = str(engine.dead_error) if engine.dead_error is not None else "engine stopped"
        return Response(
            HealthStatus(
                status="unavailable", model=service.model_name, detail=detail, registry=registry
            ),
            status_code=503,
        )

    @get("/metrics", summary="Prometheus metrics", media_type=CONTENT_TYPE)
    async def metrics(self, service: Service) -> Response[bytes]:
        return Response(await service.metrics_text(), media_type=CONTENT_TYPE)


def registry_health(service: GatewayService) -> tuple[RegistryHealth, str | None]:
    """The registry's state, and what is wrong with it in one sentence (None: nothing)."""
    health = service.health
    registry = RegistryHealth(
        backend=health.where,
        reachable=health.reachable,
        watching=health.watching,
        error=health.error,
        down_since=health.down_since,
        orphaned_adapters=len(service.adapters.catalog.orphans),
        orphaned_tenants=len(service.auth.orphans),
        pending_usage_records=service.usage_meter.pending,
    )
    if not health.reachable:
        problem = (
            f"the registry store at {health.where} is unreachable: serving the adapters and "
            "tenants known here; registrations and tenant changes fail with 503"
        )
    elif not health.watching:
        problem = f"not yet subscribed to the registry store's changes at {health.where}"
    elif registry.orphaned_adapters or registry.orphaned_tenants:
        problem = (
            f"the registry store at {health.where} lost its data: serving "
            f"{registry.orphaned_adapters} adapters and {registry.orphaned_tenants} tenants "
            "known here until they are registered again"
        )
    elif registry.pending_usage_records:
        problem = (
            f"{registry.pending_usage_records} usage counts wait to be written to the registry "
            f"store at {health.where}"
        )
    else:
        problem = None
    return registry, problem
