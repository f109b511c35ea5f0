"""The Litestar application: routes, error shapes, authentication, and a lifespan that owns
the engine and the registry store's background sync.

The app factory builds every service the routes use, each from the collaborators it names,
and keeps them in the app's state; each route handler asks Litestar for the ones it uses,
by name (`NamedDependency`), through the providers declared here."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from contextlib import asynccontextmanager

from litestar import Litestar, Request
from litestar.datastructures import State
from litestar.di import Provide
from litestar.openapi import OpenAPIConfig

from loragate.engine import AsyncLLMEngine, EngineClient
from loragate.gateway.adapter_control.manager import AdapterManager
from loragate.gateway.adapter_control.store_setup import adapter_uploads, with_adapter_store
from loragate.gateway.adapter_control.sync import RegistrySync
from loragate.gateway.admin.adapters import AdaptersController, VLLMLoRAController
from loragate.gateway.admin.tenants import TenantsController, UsageController
from loragate.gateway.errors import openai_error_response
from loragate.gateway.openai.chat import ChatController
from loragate.gateway.openai.chat_template import load_chat_template
from loragate.gateway.openai.completions import CompletionsController
from loragate.gateway.openai.models import ModelsController
from loragate.gateway.openai.tokenize import TokenizeController
from loragate.gateway.operations.body_depth import DepthCheckedRequest
from loragate.gateway.operations.dashboard import Dashboard, DashboardController
from loragate.gateway.operations.health import HealthController, RegistryStatus
from loragate.gateway.operations.lifecycle import Lifecycle
from loragate.gateway.operations.metrics import GatewayMetrics
from loragate.gateway.operations.metrics_report import MetricsReport
from loragate.gateway.operations.registry_care import RegistryCare
from loragate.gateway.operations.startup_log import log_startup, registry_description
from loragate.gateway.replicas.reports import ReplicaReports
from loragate.gateway.replicas.routes import ReplicasController
from loragate.gateway.replicas.wire import ReplicaReport
from loragate.gateway.serving.admission import Admission
from loragate.gateway.serving.generations import Generations
from loragate.gateway.serving.served_model import ServedModel
from loragate.gateway.settings import GatewaySettings
from loragate.gateway.store_seam import StoreSeam
from loragate.gateway.tenancy.auth import Authenticator, AuthGate
from loragate.gateway.tenancy.principal import Principal, caller_of
from loragate.gateway.tenancy.quotas import QuotaKeeper
from loragate.gateway.tenancy.tenants import TenantService
from loragate.gateway.tenancy.usage_meter import UsageMeter
from loragate.gateway.tgi.routes import TGIController
from loragate.registry import RegistryStore, make_registry_store

log = logging.getLogger(__name__)

API_VERSION = "0.1.0"


def create_app(
    settings: GatewaySettings,
    engine: EngineClient | None = None,
    store: RegistryStore | None = None,
) -> Litestar:
    """The app for `settings`. The lifespan starts the engine (unless one is given) and
    stops it on shutdown; a given engine stays the caller's to shut down. With
    `settings.replicated` the engine is N replicas on Ray Serve (gateway/replicas/), which
    the lifespan deploys and, on shutdown, drains and removes. The registry
    store is built from the settings unless one is given (used on the app's event loop
    only); the app closes it on shutdown either way."""

    @asynccontextmanager
    async def lifespan(app: Litestar):
        owned = engine is None
        running = engine
        replicas = None
        if running is None and settings.replicated:
            from loragate.gateway.replicas.cluster import RayReplicas

            replicas = RayReplicas(settings)
            running = await asyncio.to_thread(replicas.start)
        elif running is None:
            log.info("starting the engine for %s", settings.engine.model or "the default model")
            running = await asyncio.to_thread(
                AsyncLLMEngine.from_config,
                settings.engine,
                settings.adapter_load_timeout_seconds,
            )
        reports = replicas.engine.replica_reports if replicas is not None else None
        services, lifecycle = build_services(settings, running, store, reports)
        log_startup(running.model_info, registry_description(services["store"].health.where))
        for name, service in services.items():
            app.state[name] = service
        try:
            await lifecycle.startup()
            yield
        finally:
            await lifecycle.shutdown()
            if owned:
                running.shutdown()
            if replicas is not None:
                await asyncio.to_thread(replicas.stop)

    return Litestar(
        route_handlers=[
            CompletionsController,
            ChatController,
            ModelsController,
            TokenizeController,
            AdaptersController,
            VLLMLoRAController,
            TGIController,
            HealthController,
            TenantsController,
            UsageController,
            DashboardController,
            ReplicasController,
        ],
        lifespan=[lifespan],
        middleware=[AuthGate],
        dependencies={name: _provider(name) for name in SERVICES}
        | {"caller": Provide(_caller, sync_to_thread=False)},
        exception_handlers={Exception: openai_error_response},
        request_max_body_size=settings.max_body_bytes,
        request_class=DepthCheckedRequest,
        openapi_config=OpenAPIConfig(
            title="loragate",
            version=API_VERSION,
            description="Multi-LoRA serving gateway: OpenAI-, vLLM- and TGI/LoRAX-compatible.",
        ),
        logging_config=None,
    )


# The services routes may ask for by name, each built by `build_services`.
SERVICES = (
    "engine",
    "served_model",
    "generations",
    "adapters",
    "catalog",
    "uploads",
    "tenants",
    "auth",
    "registry_status",
    "metrics_report",
    "dashboard",
    "replicas",
)


def build_services(
    settings: GatewaySettings,
    engine: EngineClient,
    store: RegistryStore | None = None,
    replica_reports: Callable[[], Awaitable[list[ReplicaReport]]] | None = None,
) -> tuple[dict[str, object], Lifecycle]:
    """Every service the routes use, by name (SERVICES, and the store seam), and the
    lifecycle that starts and stops them. `replica_reports`: the replicas' own reports (Ray
    Serve); None: this process's engine is the one."""
    model = engine.model_info
    seam = StoreSeam(store if store is not None else build_store(settings))
    admission = Admission(model.max_num_seqs, settings.max_queue, settings.retry_after_seconds)
    metrics = GatewayMetrics(model.served_name, settings.metrics_label_limit)
    in_process = replica_reports is None
    engine, objects = with_adapter_store(settings, engine, seam, in_process)
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
    generations = Generations(engine, admission, adapters, quotas, usage_meter, metrics)
    lifecycle = Lifecycle(
        settings, model, seam, care, sync, adapters, quotas, usage_meter, generations
    )
    auto_tool_parser = settings.tool_call_parser if settings.enable_auto_tool_choice else None
    replicas = ReplicaReports(
        engine, adapters.catalog, objects, settings.replicated, replica_reports
    )
    services = {
        "engine": engine,
        "served_model": ServedModel(
            engine,
            adapters,
            aliases=settings.model_aliases,
            chat_template=load_chat_template(settings.chat_template),
            auto_tool_parser=auto_tool_parser,
        ),
        "generations": generations,
        "adapters": adapters,
        "catalog": adapters.catalog,
        "uploads": adapter_uploads(settings, adapters, objects),
        "tenants": TenantService(seam, auth, usage_meter, adapters.drop_tenant),
        "auth": auth,
        "registry_status": RegistryStatus(seam, adapters.catalog, auth, usage_meter, sync, care),
        "metrics_report": MetricsReport(
            engine, metrics, admission, adapters.catalog, seam, usage_meter, care, replicas
        ),
        "dashboard": Dashboard(engine, metrics.traffic, adapters.catalog, seam, model.served_name),
        "replicas": replicas,
        "store": seam,
    }
    return services, lifecycle


def build_store(settings: GatewaySettings) -> RegistryStore:
    """The in-memory store, or the Redis one (under its namespace) with --redis-url."""
    options = {"lease_ttl_s": settings.quota_lease_seconds}
    if settings.redis_url is not None:
        options["namespace"] = settings.redis_namespace
    return make_registry_store(settings.redis_url, **options)


def _provider(name: str) -> Provide:
    """Litestar's provider of the service `name` that the lifespan keeps in the app's state."""

    def service(state: State) -> object:
        return state[name]

    return Provide(service, sync_to_thread=False)


def _caller(request: Request) -> Principal:
    return caller_of(request)
