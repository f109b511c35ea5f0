"""GET /dashboard: one page for the operator, served by the gateway itself (no build step, no
CDN: it works offline), that polls GET /dashboard/data and draws with plain canvas.

The page holds no data; its JSON names every tenant's adapters, so under tenancy it needs
the admin key (the page asks for it once and keeps it in sessionStorage); on an open server
anyone is the operator.
"""

from __future__ import annotations

import time
from pathlib import Path

import msgspec
from litestar import Controller, Response, get

from loragate.engine import EngineDeadError
from loragate.gateway.admin.guards import admin_only
from loragate.gateway.serving.service import Service
from loragate.gateway.tenancy.principal import OPERATOR

PAGE = Path(__file__).with_name("dashboard.html")
OPERATOR_ONLY = {"admin_only": "the dashboard shows the whole deployment and needs the admin key"}


class AdapterRow(msgspec.Struct):
    name: str
    tier: str  # device, cpu, disk, or "" for __other__ and __base__
    requests: int
    generation_tokens: int


class TenantRow(msgspec.Struct):
    name: str
    requests: int
    generation_tokens: int


class DashboardData(msgspec.Struct):
    time: float
    model: str
    running: int
    waiting: int
    kv_usage: float
    prompt_tokens: int
    generation_tokens: int
    ttft_p50: float | None
    ttft_p95: float | None
    adapters: list[AdapterRow]
    tenants: list[TenantRow]


class DashboardController(Controller):
    path = "/dashboard"
    tags = ["Operations"]

    @get("/", summary="The operator dashboard (HTML)", media_type="text/html")
    async def page(self) -> Response[bytes]:
        # The page itself holds no data; its JSON needs the key.
        return Response(PAGE.read_bytes(), media_type="text/html; charset=utf-8")

    @get("/data", summary="What the dashboard plots", guards=[admin_only], opt=OPERATOR_ONLY)
    async def data(self, service: Service) -> DashboardData:
        return await dashboard_data(service)


async def dashboard_data(service) -> DashboardData:
    stats = None
    if service.engine.is_running:
        try:
            stats = await service.engine.stats()
        except EngineDeadError:
            stats = None
    traffic = service.metrics.traffic
    records = await service.adapters.catalog.list(OPERATOR)
    tiers = stats.adapter_tiers if stats is not None else {}
    tier_of = {r.key: tiers.get(r.sha256, "disk") for r in records}
    adapters = [
        AdapterRow(key, tier_of.get(key, ""), row[0], row[2])
        for key, row in sorted(traffic.by_adapter.items(), key=lambda kv: -kv[1][2])
    ]
    idle = sorted(k for k in tier_of if k not in traffic.by_adapter)
    adapters += [AdapterRow(k, tier_of[k], 0, 0) for k in idle]
    ttfts = sorted(traffic.recent_ttft)
    return DashboardData(
        time=time.time(),
        model=service.model_name,
        running=stats.running if stats else 0,
        waiting=stats.waiting if stats else 0,
        kv_usage=float(stats.memory.get("utilization", 0.0)) if stats else 0.0,
        prompt_tokens=sum(row[1] for row in traffic.by_tenant.values()),
        generation_tokens=sum(row[2] for row in traffic.by_tenant.values()),
        ttft_p50=_quantile(ttfts, 0.5),
        ttft_p95=_quantile(ttfts, 0.95),
        adapters=adapters[:200],
        tenants=[TenantRow(k, r[0], r[2]) for k, r in sorted(traffic.by_tenant.items())],
    )


def _quantile(sorted_values: list[float], q: float) -> float | None:
    if not sorted_values:
        return None
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]
