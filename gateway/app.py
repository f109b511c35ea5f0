"""The Litestar application: routes, error shapes, authentication, and a lifespan that owns
the engine and the registry store's background sync."""

from __future__ import annotations

import asyncio
import logging
from contextlib import asynccontextmanager

from litestar import Litestar, Request
from litestar.datastructures import State
from litestar.di import Provide
from litestar.openapi import OpenAPIConfig

from loragate.engine import AsyncLLMEngine, EngineClient
from loragate.gateway.admin.adapters import AdaptersController, VLLMLoRAController
from loragate.gateway.admin.health import HealthController
from loragate.gateway.admin.tenants import TenantsController, UsageController
from loragate.gateway.errors import openai_error_response
from loragate.gateway.openai.chat import ChatController
from loragate.gateway.openai.completions import CompletionsController
from loragate.gateway.openai.models import ModelsController
from loragate.gateway.openai.tokenize import TokenizeController
from loragate.gateway.operations.body_depth import DepthCheckedRequest
from loragate.gateway.operations.dashboard import DashboardController
from loragate.gateway.operations.settings import GatewaySettings
from loragate.gateway.operations.startup_log import log_startup, registry_description
from loragate.gateway.replicas.routes import ReplicasController
from loragate.gateway.serving.service import GatewayService
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
            )
        reports = replicas.engine.replica_reports if replicas is not None else None
        service = GatewayService(settings, running, store, reports)
        log_startup(service.model, registry_description(service.health.where))
        app.state.service = service
        try:
            await service.startup()
            yield
        finally:
            await service.shutdown()
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
        dependencies={
            "service": Provide(_service, sync_to_thread=False),
            "caller": Provide(_caller, sync_to_thread=False),
        },
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


def _service(state: State) -> GatewayService:
    return state.service


def _caller(request: Request) -> Principal:
    return caller_of(request)
