"""GET /metrics's text: the gateway's own counters, the engine's state read at scrape time,
and with replicas each replica's."""

from __future__ import annotations

from loragate.engine import EngineClient, EngineDeadError
from loragate.gateway.adapter_control.catalog import AdapterCatalog
from loragate.gateway.observation.metrics import GatewayMetrics
from loragate.gateway.observation.scrape import AdapterView, GatewayGauges
from loragate.gateway.registry_care.care import RegistryCare
from loragate.gateway.registry_seam import RegistrySeam
from loragate.gateway.replicas.metrics import replica_metrics_text
from loragate.gateway.replicas.reports import ReplicaReports
from loragate.gateway.serving.admission import Admission
from loragate.gateway.tenancy.principal import OPERATOR
from loragate.gateway.tenancy.usage_meter import UsageMeter


class MetricsReport:
    def __init__(
        self,
        engine: EngineClient,
        metrics: GatewayMetrics,
        admission: Admission,
        catalog: AdapterCatalog,
        store: RegistrySeam,
        usage_meter: UsageMeter,
        care: RegistryCare,
        replicas: ReplicaReports,
    ):
        self.engine = engine
        self.metrics = metrics
        self.admission = admission
        self.catalog = catalog
        self.health = store.health
        self.usage_meter = usage_meter
        self.care = care
        self.replicas = replicas

    async def render(self) -> bytes:
        snapshot = None
        if self.engine.is_running:
            try:
                snapshot = await self.engine.stats()
            except EngineDeadError:
                snapshot = None
        records = await self.catalog.list(OPERATOR)
        care = self.care
        gauges = GatewayGauges(
            in_flight=self.admission.in_flight,
            queued=self.admission.waiting,
            queue_capacity=self.admission.capacity,
            registered_adapters=len(records),
            engine_up=self.engine.is_running,
            registry_reachable=self.health.reachable,
            usage_pending=self.usage_meter.pending,
            registry_durable=care.persistence is not None and care.persistence.durable,
            registry_backup_at=care.newest_backup.exported_at if care.newest_backup else 0,
        )
        view = AdapterView(
            sha256_of={r.key: r.sha256 for r in records},
            kind_of={r.key: r.kind for r in records},
            size_of={r.key: r.size_bytes for r in records},
            max_loras=self.engine.model_info.max_loras,
        )
        text = self.metrics.render(snapshot, gauges, view)
        if self.replicas.replicated:
            text += replica_metrics_text(await self.replicas.reports())
        return text
