"""Prometheus metrics: request latencies observed here, engine state read at scrape time.

Each app owns its CollectorRegistry (no process-wide default registry), so several
servers in one process (tests, the benchmark) never share counters. Adapter and tenant
names appear as label values only through observation/labels.py's bound; every other label
takes values from small fixed sets (finish reasons, cache tiers).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from loragate.adapters import LoRARequest
from loragate.engine import EngineStats
from loragate.gateway.observation.labels import BASE, BoundedLabels
from loragate.gateway.observation.scrape import AdapterView, GatewayGauges, ScrapeCollector
from loragate.gateway.observation.spec_decode_metrics import SpecDecodeCollector
from loragate.gateway.observation.traffic import RequestRecord, RequestTraffic, request_record
from loragate.gateway.serving.generation import Generation
from loragate.gateway.tenancy.principal import UNTENANTED

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_LATENCY_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
)
_TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class GatewayMetrics:
    def __init__(self, model_name: str = "", label_limit: int = 50) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.traffic = RequestTraffic(self.registry, model_name, label_limit)
        self._scrape = ScrapeCollector(model_name, self.traffic.adapter_labels)
        self.registry.register(self._scrape)
        self._fair_share = FairShareCollector(model_name, self.traffic.tenant_labels)
        self.registry.register(self._fair_share)
        self._spec_decode = SpecDecodeCollector(model_name, self.traffic.adapter_labels)
        self.registry.register(self._spec_decode)
        self.ttft = Histogram(
            "loragate_time_to_first_token_seconds",
            "From request arrival at the gateway to its first generated token",
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.tpot = Histogram(
            "loragate_time_per_output_token_seconds",
            "Mean time between output tokens of one request, after the first",
            buckets=_TOKEN_BUCKETS,
            registry=self.registry,
        )
        self.e2e = Histogram(
            "loragate_e2e_request_latency_seconds",
            "From request arrival at the gateway to its last token",
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.finished = Counter(
            "loragate_request_success",
            "Requests that ran to the end, by finish reason",
            ["finish_reason"],
            registry=self.registry,
        )
        self.aborted = Counter(
            "loragate_request_aborted",
            "Requests stopped early (client gone, server draining)",
            registry=self.registry,
        )
        self.rejected = Counter(
            "loragate_request_rejected",
            "Requests refused before reaching the engine, by reason",
            ["reason"],
            registry=self.registry,
        )
        self.rejected.labels("queue_full")  # exported at 0 from the start, for dashboards

    def describe_base(self, quantization: str, weight_bytes: tuple[tuple[str, int], ...]) -> None:
        """The base's quantization and bytes held per tensor type, exported from now on."""
        self._scrape.base_weights = (quantization or "none", tuple(weight_bytes))

    def count_rejected(self, reason: str) -> None:
        self.rejected.labels(reason).inc()

    def count_rate_limited(self, tenant: str, reason: str) -> None:
        self.traffic.count_rate_limited(tenant, reason)

    def observe_generation(
        self, gen: Generation, lora: LoRARequest | None, tenant: str | None
    ) -> None:
        """One engine request that reached the engine, as it closed."""
        adapter = BASE if lora is None else lora.lora_name
        self.observe_request(request_record(gen, adapter, tenant or UNTENANTED))

    def observe_request(self, record: RequestRecord) -> None:
        self.traffic.observe(record)
        ttft, e2e, finish_reason = record.ttft, record.e2e, record.finish_reason
        num_tokens = record.output_len
        if finish_reason is None or finish_reason == "abort":
            self.aborted.inc()
            return
        self.finished.labels(finish_reason).inc()
        self.e2e.observe(e2e)
        if ttft is not None:
            self.ttft.observe(ttft)
            if num_tokens > 1:
                self.tpot.observe((e2e - ttft) / (num_tokens - 1))

    def render(
        self,
        engine: EngineStats | None,
        gateway: GatewayGauges,
        adapters: AdapterView | None = None,
    ) -> bytes:
        self._scrape.engine = engine
        self._fair_share.engine = engine
        self._spec_decode.engine = engine
        self._scrape.gateway = gateway
        self._scrape.adapters = adapters or AdapterView()
        return generate_latest(self.registry)


class FairShareCollector:
    """The engine's service counters per tenant (engine/core/fair_share.py), read at scrape time:
    what the `fair` policy shares out, so an operator can see who got what. Tenants past the
    label limit are summed under OTHER (their virtual counter: the largest)."""

    def __init__(self, model_name: str, labels: BoundedLabels) -> None:
        self.engine: EngineStats | None = None
        self.model_name = model_name
        self.labels = labels

    def collect(self):
        e = self.engine
        if e is None:
            return
        served = CounterMetricFamily(
            "loragate_tenant_service_tokens",
            "Weighted tokens computed for each tenant (prompt tokens 1, generated 2; without "
            "a tenant, per adapter): the service --scheduling-policy fair shares out",
            labels=["model_name", "tenant"],
        )
        for label, value in self._by_label(e.tenant_service, sum).items():
            served.add_metric([self.model_name, label], value)
        yield served
        virtual = GaugeMetricFamily(
            "loragate_tenant_virtual_service",
            "The fair policy's counter of each active tenant: its service divided by its "
            "weight, lifted to the lowest active one when it returns from idle",
            labels=["model_name", "tenant"],
        )
        for label, value in self._by_label(e.tenant_virtual_service, max).items():
            virtual.add_metric([self.model_name, label], value)
        yield virtual
        preempted = CounterMetricFamily(
            "loragate_tenant_preemptions",
            "Sequences of each tenant preempted (KV pressure, or a waiting request owed its "
            "fair share or of a higher priority); they resume with the same output",
            labels=["model_name", "tenant"],
        )
        for label, value in self._by_label(e.tenant_preemptions, sum).items():
            preempted.add_metric([self.model_name, label], value)
        yield preempted

    def _by_label(self, values: dict, combine) -> dict[str, float]:
        grouped: dict[str, list[float]] = {}
        for key, value in values.items():
            grouped.setdefault(self.labels.label(key), []).append(value)
        return {label: combine(group) for label, group in grouped.items()}
