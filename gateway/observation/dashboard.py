"""GET /dashboard: one page for the operator, served by the gateway itself (no build step, no
CDN: it works offline), that polls GET /dashboard/data and draws with plain canvas.

The page holds no data; its JSON names every tenant's adapters, so under tenancy it needs
the admin key (the page asks for it once and keeps it in sessionStorage); on an open server
anyone is the operator.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import msgspec
from litestar import Controller, Response, get

from loragate.engine import EngineClient, EngineDeadError
from loragate.gateway.adapter_control.catalog import AdapterCatalog
from loragate.gateway.admin.guards import admin_only
from loragate.gateway.errors import RegistryDownError
from loragate.gateway.observation.traffic import RequestTraffic
from loragate.gateway.registry_seam import RegistrySeam
from loragate.gateway.tenancy.principal import OPERATOR

PAGE = Path(__file__).with_name("dashboard.html")
MAX_ROWS = 200  # per table: the page stays light with thousands of adapters or tenants
OPERATOR_ONLY = {"admin_only": "the dashboard shows the whole deployment and needs the admin key"}


class AdapterRow(msgspec.Struct):
    name: str
    tier: str  # device, cpu, disk, or "" for __other__ and __base__
    requests: int
    generation_tokens: int


class TenantRow(msgspec.Struct):
    """Lifetime counts, then usage against each per-minute quota (None: unlimited)."""

    name: str
    requests: int
    generation_tokens: int
    requests_last_minute: int = 0
    tokens_last_minute: int = 0  # prompt + generated, as tokens_per_minute counts them
    in_flight: int | None = None  # across replicas (the store's leases); None: not known
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    max_concurrent_requests: int | None = None
    rate_limited: int = 0  # requests a quota refused here (429), since this server started


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
    async def data(self, dashboard: Dashboard) -> DashboardData:
        return await dashboard.data()


class Dashboard:
    """What the page plots: the engine's state, the traffic of each adapter and tenant, and
    each tenant's quotas and requests in flight from the store."""

    def __init__(
        self,
        engine: EngineClient,
        traffic: RequestTraffic,
        catalog: AdapterCatalog,
        store: RegistrySeam,
        model_name: str,
    ):
        self.engine = engine
        self.traffic = traffic
        self.catalog = catalog
        self.store = store
        self.model_name = model_name

    async def data(self) -> DashboardData:
        stats = None
        if self.engine.is_running:
            try:
                stats = await self.engine.stats()
            except EngineDeadError:
                stats = None
        traffic = self.traffic
        records = await self.catalog.list(OPERATOR)
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
            model=self.model_name,
            running=stats.running if stats else 0,
            waiting=stats.waiting if stats else 0,
            kv_usage=float(stats.memory.get("utilization", 0.0)) if stats else 0.0,
            prompt_tokens=sum(row[1] for row in traffic.by_tenant.values()),
            generation_tokens=sum(row[2] for row in traffic.by_tenant.values()),
            ttft_p50=_quantile(ttfts, 0.5),
            ttft_p95=_quantile(ttfts, 0.95),
            adapters=adapters[:MAX_ROWS],
            tenants=await self._tenant_rows(),
        )

    async def _tenant_rows(self) -> list[TenantRow]:
        """Every tenant that has a record or traffic: the busiest of the last minute first."""
        traffic = self.traffic
        try:
            records = {t.name: t for t in await self.store.list_tenants()}
        except RegistryDownError:
            records = {}  # the store is down: traffic only, quotas unknown
        minute = traffic.tenant_minute.totals()
        names = sorted(
            set(records) | set(traffic.by_tenant),
            key=lambda n: (-minute.get(n, (0, 0))[1], n),
        )[:MAX_ROWS]
        rows = []
        for name in names:
            lifetime = traffic.by_tenant.get(name, (0, 0, 0))
            recent = minute.get(name, (0, 0))
            row = TenantRow(name, lifetime[0], lifetime[2], recent[0], recent[1])
            row.rate_limited = traffic.rate_limited_by_tenant.get(name, 0)
            record = records.get(name)
            if record is not None:
                quota = record.quota
                row.requests_per_minute = quota.requests_per_minute
                row.tokens_per_minute = quota.tokens_per_minute
                row.max_concurrent_requests = quota.max_concurrent_requests
            rows.append(row)
        known = [row for row in rows if row.name in records]
        counts = await asyncio.gather(*(self._in_flight(row.name) for row in known))
        for row, count in zip(known, counts, strict=True):
            row.in_flight = count
        return rows

    async def _in_flight(self, tenant: str) -> int | None:
        try:
            return await self.store.in_flight(tenant)
        except RegistryDownError:
            return None


def _quantile(sorted_values: list[float], q: float) -> float | None:
    if not sorted_values:
        return None
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]
