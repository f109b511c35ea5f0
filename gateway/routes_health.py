"""GET /health (load balancers) and GET /metrics (Prometheus)."""

from __future__ import annotations

from litestar import Controller, Response, get

from loragate.gateway.metrics import CONTENT_TYPE
from loragate.gateway.schemas_admin import HealthStatus
from loragate.gateway.service import Service


class HealthController(Controller):
    path = "/"
    tags = ["Operations"]

    @get("/health", summary="200 while the engine runs, 503 once it has died")
    async def health(self, service: Service) -> Response[HealthStatus]:
        engine = service.engine
        if engine.is_running:
            return Response(HealthStatus(status="ok", model=service.model_name))
        detail = str(engine.dead_error) if engine.dead_error is not None else "engine stopped"
        return Response(
            HealthStatus(status="unavailable", model=service.model_name, detail=detail),
            status_code=503,
        )

    @get("/metrics", summary="Prometheus metrics", media_type=CONTENT_TYPE)
    async def metrics(self, service: Service) -> Response[bytes]:
        return Response(await service.metrics_text(), media_type=CONTENT_TYPE)
