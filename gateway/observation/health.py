"""GET /health (load balancers; no key needed) and GET /metrics (Prometheus).

/health is 200 while the engine runs: "ok", or "degraded" while the registry store is
unreachable (or lost its data and the replica serves what it knew). It is 503 once the
engine has died. Anyone sees the status and whether the registry store is reachable; only
the operator (the admin key, or anyone on a server without tenancy) sees where the store
is and the rest of its state, since an unauthenticated caller must learn nothing about the
deployment.

/metrics counts the whole deployment (every tenant's adapters and traffic), so under
tenancy it needs the admin key; a tenant reads its own usage at /v1/usage.
"""

from __future__ import annotations

from litestar import Controller, Request, Response, get

from loragate.engine import EngineClient
from loragate.gateway.adapter_control.catalog import AdapterCatalog
from loragate.gateway.adapter_control.sync import RegistrySync
from loragate.gateway.admin.guards import admin_only
from loragate.gateway.admin.schemas import HealthStatus, RegistryHealth
from loragate.gateway.observation.metrics import CONTENT_TYPE
from loragate.gateway.observation.metrics_report import MetricsReport
from loragate.gateway.registry_care.care import RegistryCare
from loragate.gateway.registry_seam import RegistrySeam
from loragate.gateway.serving.served_model import ServedModel
from loragate.gateway.tenancy.auth import Authenticator
from loragate.gateway.tenancy.usage_meter import UsageMeter


class HealthController(Controller):
    path = "/"
    tags = ["Operations"]

    @get("/health", summary="200 while the engine runs (ok or degraded), 503 once it has died")
    async def health(
        self,
        request: Request,
        engine: EngineClient,
        auth: Authenticator,
        registry_status: RegistryStatus,
        served_model: ServedModel,
    ) -> Response[HealthStatus]:
        registry, problem = registry_status.report()
        status = "degraded" if problem else "ok"
        operator = auth.is_operator(request.headers.get("authorization"))
        if not operator:
            registry = RegistryHealth(reachable=registry.reachable)
            problem = _public_problem(status, registry.reachable)
        if engine.is_running:
            return Response(
                HealthStatus(
                    status=status, model=served_model.model_name, detail=problem, registry=registry
                )
            )
        detail = "the engine stopped"
        if operator and engine.dead_error is not None:
            detail = str(engine.dead_error)
        return Response(
            HealthStatus(
                status="unavailable",
                model=served_model.model_name,
                detail=detail,
                registry=registry,
            ),
            status_code=503,
        )

    @get(
        "/metrics",
        summary="Prometheus metrics",
        media_type=CONTENT_TYPE,
        guards=[admin_only],
        opt={
            "admin_only": "/metrics shows the whole deployment and needs the admin key; a "
            "tenant's own usage is at /v1/usage"
        },
    )
    async def metrics(self, metrics_report: MetricsReport) -> Response[bytes]:
        return Response(await metrics_report.render(), media_type=CONTENT_TYPE)


def _public_problem(status: str, reachable: bool) -> str | None:
    """What anyone may read: no address, no counts."""
    if status == "ok":
        return None
    if not reachable:
        return "the registry store is unreachable; adapters and tenants known here are served"
    return "the registry store is reachable but not in sync yet; see /health with the admin key"


class RegistryStatus:
    """The registry store's state as this replica sees it, for /health."""

    def __init__(
        self,
        store: RegistrySeam,
        catalog: AdapterCatalog,
        auth: Authenticator,
        usage_meter: UsageMeter,
        sync: RegistrySync,
        care: RegistryCare,
    ):
        self.health = store.health
        self.catalog = catalog
        self.auth = auth
        self.usage_meter = usage_meter
        self.sync = sync
        self.care = care

    def report(self) -> tuple[RegistryHealth, str | None]:
        """The registry's state, and what is wrong with it in one sentence (None: nothing)."""
        health = self.health
        registry = RegistryHealth(
            backend=health.where,
            reachable=health.reachable,
            watching=health.watching,
            error=health.error,
            down_since=health.down_since,
            orphaned_adapters=len(self.catalog.orphans),
            orphaned_tenants=len(self.auth.orphans),
            pending_usage_records=self.usage_meter.pending,
            **self._care(),
        )
        if not health.reachable:
            problem = (
                f"the registry store at {health.where} is unreachable: serving the adapters "
                "and tenants known here; registrations and tenant changes fail with 503"
            )
        elif not health.watching:
            problem = f"not yet subscribed to the registry store's changes at {health.where}"
        elif registry.orphaned_adapters or registry.orphaned_tenants:
            problem = (
                f"the registry store at {health.where} lost its data: serving "
                f"{registry.orphaned_adapters} adapters and {registry.orphaned_tenants} "
                "tenants known here until they are registered again or imported; "
                + (self.care.lost_data_note(self.sync.data_lost_at) or "")
            )
        elif registry.pending_usage_records:
            problem = (
                f"{registry.pending_usage_records} usage counts wait to be written to the "
                f"registry store at {health.where}"
            )
        else:
            problem = None
        return registry, problem

    def _care(self) -> dict:
        """Persistence as checked at start; the loss of the store's data and the newest
        backup."""
        care = self.care
        persistence, newest = care.persistence, care.newest_backup
        return dict(
            durable=None if persistence is None else persistence.durable,
            persistence=None if persistence is None else persistence.summary,
            data_lost_at=self.sync.data_lost_at,
            newest_backup=None if newest is None else str(newest.path),
            newest_backup_at=None if newest is None else newest.exported_at,
            backup_error=care.backup_error,
        )
