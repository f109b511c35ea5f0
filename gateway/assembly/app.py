"""The Litestar application: routes, error shapes, authentication, and a lifespan that owns
the engine and the registry store's background sync.

The lifespan starts the engine, assembles the services the routes use (services.py), keeps
them as `app.state.services`, and each route handler gets the typed services it names
through Litestar's `Provide`."""

from __future__ import annotations

import asyncio
import logging
from contextlib import asynccontextmanager

from litestar import Litestar, Request
from litestar.di import Provide
from litestar.openapi import OpenAPIConfig

from loragate.engine import AsyncLLMEngine, EngineClient
from loragate.gateway.adapter_control.adapter_store_setup import (
    adapter_fetcher,
)
from loragate.gateway.admin.adapters import AdaptersController, VLLMLoRAController
from loragate.gateway.admin.tenants import TenantsController, UsageController
from loragate.gateway.assembly.body_depth import DepthCheckedRequest
from loragate.gateway.assembly.services import build_services, service_providers
from loragate.gateway.errors import openai_error_response
from loragate.gateway.observation.dashboard import DashboardController
from loragate.gateway.observation.health import HealthController
from loragate.gateway.observation.startup_log import log_startup, registry_description
from loragate.gateway.openai.chat import ChatController
from loragate.gateway.openai.completions import CompletionsController
from loragate.gateway.openai.models import ModelsController
from loragate.gateway.openai.tokenize import TokenizeController
from loragate.gateway.replicas.routes import ReplicasController
from loragate.gateway.settings import GatewaySettings
from loragate.gateway.tenancy.auth import AuthGate
from loragate.gateway.tenancy.principal import Principal, caller_of
from loragate.gateway.tgi.routes import TGIController
from loragate.registry import RegistryStore

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
                # its way to adapter store objects (replicas have their own)
                adapter_fetcher(settings.adapter_store, settings.adapter_cache_dir),
            )
        reports = replicas.engine.replica_reports if replicas is not None else None
        services, lifecycle = build_services(settings, running, store, reports)
        log_startup(running.model_info, registry_description(lifecycle.store.health.where))
        app.state.services = services
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
        dependencies=service_providers() | {"caller": Provide(_caller, sync_to_thread=False)},
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


def _caller(request: Request) -> Principal:
    return caller_of(request)
