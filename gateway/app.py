"""The Litestar application: routes, error shapes, and a lifespan that owns the engine."""

from __future__ import annotations

import asyncio
import logging
from contextlib import asynccontextmanager

from litestar import Litestar
from litestar.datastructures import State
from litestar.di import Provide
from litestar.openapi import OpenAPIConfig

from loragate.engine.async_engine import AsyncLLMEngine
from loragate.gateway.errors import openai_error_response
from loragate.gateway.registry import AdapterRegistry
from loragate.gateway.routes_adapters import AdaptersController, VLLMLoRAController
from loragate.gateway.routes_chat import ChatController
from loragate.gateway.routes_completions import CompletionsController
from loragate.gateway.routes_health import HealthController
from loragate.gateway.routes_models import ModelsController
from loragate.gateway.routes_tgi import TGIController
from loragate.gateway.service import GatewayService
from loragate.gateway.settings import GatewaySettings

log = logging.getLogger(__name__)

API_VERSION = "0.1.0"


def create_app(
    settings: GatewaySettings,
    engine: AsyncLLMEngine | None = None,
    registry: AdapterRegistry | None = None,
) -> Litestar:
    """The app for `settings`. The lifespan starts the engine (unless one is given) and
    stops it on shutdown; a given engine stays the caller's to shut down."""

    @asynccontextmanager
    async def lifespan(app: Litestar):
        owned = engine is None
        running = engine
        if running is None:
            log.info("starting the engine for %s", settings.engine.model or "the default model")
            running = await asyncio.to_thread(AsyncLLMEngine.from_config, settings.engine)
        service = GatewayService(settings, running, registry)
        app.state.service = service
        try:
            await service.startup()
            yield
        finally:
            await service.adapters.close()
            if owned:
                running.shutdown()

    return Litestar(
        route_handlers=[
            CompletionsController,
            ChatController,
            ModelsController,
            AdaptersController,
            VLLMLoRAController,
            TGIController,
            HealthController,
        ],
        lifespan=[lifespan],
        dependencies={"service": Provide(_service, sync_to_thread=False)},
        exception_handlers={Exception: openai_error_response},
        request_max_body_size=settings.max_body_bytes,
        openapi_config=OpenAPIConfig(
            title="loragate",
            version=API_VERSION,
            description="Multi-LoRA serving gateway: OpenAI-, vLLM- and TGI/LoRAX-compatible.",
        ),
        logging_config=None,
    )


def _service(state: State) -> GatewayService:
    return state.service
