"""The services the routes use, assembled once per app from the settings and the engine.

`Services` is one frozen dataclass with a typed field per service; `build_services` makes
each from the collaborators it names, and `service_providers` gives each route handler the
ones it names, typed, through Litestar's `Provide` (a handler parameter `served_model:
ServedModel` gets the app's ServedModel). The lifespan keeps the one `Services` as
`app.state.services`: the providers read it there, and so do the few readers Litestar gives
no dependencies (the auth middleware, route guards, the upload hook, the metrics port).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, fields

from litestar.datastructures import State
from litestar.di import Provide

from loragate.engine import EngineClient
from loragate.gateway.adapter_control.adapter_store_setup import adapter_objects, adapter_uploads
from loragate.gateway.adapter_control.catalog import AdapterCatalog
from loragate.gateway.adapter_control.manager import AdapterManager
from loragate.gateway.adapter_control.sync import RegistrySync
from loragate.gateway.adapter_control.uploads import AdapterUploads
from loragate.gateway.assembly.lifecycle import Lifecycle
from loragate.gateway.observation.dashboard import Dashboard
from loragate.gateway.observation.health import RegistryStatus
from loragate.gateway.observation.metrics import GatewayMetrics
from loragate.gateway.observation.metrics_report import MetricsReport
from loragate.gateway.openai.chat_template import load_chat_template
from loragate.gateway.registry_care.care import RegistryCare
from loragate.gateway.registry_seam import RegistrySeam
from loragate.gateway.replicas.reports import ReplicaReports
from loragate.gateway.replicas.wire import ReplicaReport
from loragate.gateway.serving.accounting import Accounting
from loragate.gateway.serving.admission import Admission
from loragate.gateway.serving.served_model import ServedModel
from loragate.gateway.settings import GatewaySettings
from loragate.gateway.tenancy.auth import Authenticator
from loragate.gateway.tenancy.quotas import QuotaKeeper
from loragate.gateway.tenancy.tenants import TenantService
from loragate.gateway.tenancy.usage_meter import UsageMeter
from loragate.registry import RegistryStore, make_registry_store


@dataclass(frozen=True)
class Services:
    """Every service a route handler may take, by its parameter's name and type."""

    engine: EngineClient
    served_model: ServedModel
    accounting: Accounting
    adapters: AdapterManager
    catalog: AdapterCatalog
    uploads: AdapterUploads
    tenants: TenantService
    auth: Authenticator
    registry_status: RegistryStatus
    metrics_report: MetricsReport
    dashboard: Dashboard
    replicas: ReplicaReports


def service_providers() -> dict[str, Provide]:
    """Litestar's provider of each field of the app's `Services`."""
    return {field.name: _provider(field.name) for field in fields(Services)}


def _provider(name: str) -> Provide:
    def service(state: State):
        return getattr(state.services, name)

    return Provide(service, sync_to_thread=False)


def build_services(
    settings: GatewaySettings,
    engine: EngineClient,
    store: RegistryStore | None = None,
    replica_reports: Callable[[], Awaitable[list[ReplicaReport]]] | None = None,
) -> tuple[Services, Lifecycle]:
    """Every service the routes use, and the lifecycle that starts and stops them (and
    holds the registry seam). `replica_reports`: the replicas' own reports (Ray Serve);
    None: this process's engine is the one."""
    model = engine.model_info
    seam = RegistrySeam(store if store is not None else build_store(settings))
    admission = Admission(model.max_num_seqs, settings.max_queue, settings.retry_after_seconds)
    metrics = GatewayMetrics(model.served_name, settings.metrics_label_limit)
    metrics.describe_base(model.quantization, model.weight_bytes)
    objects = adapter_objects(settings, seam, engine)
    adapters = AdapterManager(
        engine,
        seam,
        settings.adapter_root,
        model.served_name,
        load_timeout=settings.adapter_load_timeout_seconds,
        objects=objects,
    )
    auth = Authenticator(
        settings.admin_key,
        seam,
        settings.auth_cache_seconds,
        api_key=settings.api_key,
        check_for_reset=lambda: sync.resync(),
    )
    quotas = QuotaKeeper(seam, settings.quota_lease_seconds)
    usage_meter = UsageMeter(seam)
    sync = RegistrySync(
        seam,
        adapters.catalog,
        auth,
        usage_meter,
        settings.registry_resync_seconds,
        on_subscribed=lambda: lifecycle.preload_waiting_folders(),
    )
    care = RegistryCare(seam, settings, lambda: bool(adapters.catalog.orphans or auth.orphans))
    accounting = Accounting(
        engine, admission, quotas, usage_meter, metrics, adapter_root=settings.adapter_root
    )
    lifecycle = Lifecycle(
        settings, model, seam, care, sync, adapters, quotas, usage_meter, accounting
    )
    auto_tool_parser = settings.tool_call_parser if settings.enable_auto_tool_choice else None
    replicas = ReplicaReports(engine, adapters.catalog, settings.replicated, replica_reports)
    services = Services(
        engine=engine,
        served_model=ServedModel(
            engine,
            adapters,
            aliases=settings.model_aliases,
            chat_template=load_chat_template(settings.chat_template),
            auto_tool_parser=auto_tool_parser,
            reasoning_parser=settings.reasoning_parser,
        ),
        accounting=accounting,
        adapters=adapters,
        catalog=adapters.catalog,
        uploads=adapter_uploads(settings, adapters, objects),
        tenants=TenantService(seam, auth, usage_meter, adapters.drop_tenant),
        auth=auth,
        registry_status=RegistryStatus(seam, adapters.catalog, auth, usage_meter, sync, care),
        metrics_report=MetricsReport(
            engine, metrics, admission, adapters.catalog, seam, usage_meter, care, replicas
        ),
        dashboard=Dashboard(engine, metrics.traffic, adapters.catalog, seam, model.served_name),
        replicas=replicas,
    )
    return services, lifecycle


def build_store(settings: GatewaySettings) -> RegistryStore:
    """The in-memory store, or the Redis one (under its namespace) with --redis-url."""
    options = {"lease_ttl_s": settings.quota_lease_seconds}
    if settings.redis_url is not None:
        options["namespace"] = settings.redis_namespace
    return make_registry_store(settings.redis_url, **options)
