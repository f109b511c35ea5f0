"""Prometheus metrics: request latencies observed here, engine state read at scrape time.

Each app owns its CollectorRegistry (no process-wide default registry), so several
servers in one process (tests, the benchmark) never share counters. Labels take only
values from small fixed sets (finish reasons, cache tiers), never adapter names.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from loragate.engine import EngineStats

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0,
)  # fmt: skip
_TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


@dataclass
class GatewayGauges:
    in_flight: int = 0
    queued: int = 0
    queue_capacity: int = 0
    registered_adapters: int = 0
    engine_up: bool = True
    registry_reachable: bool = True
    usage_pending: int = 0


class _ScrapeCollector:
    """Yields the engine snapshot and gateway gauges taken just before the scrape."""

    def __init__(self) -> None:
        self.engine: EngineStats | None = None
        self.gateway = GatewayGauges()

    def collect(self):
        g = self.gateway
        yield _gauge("loragate_engine_up", "1 while the engine thread runs", int(g.engine_up))
        yield _gauge(
            "loragate_gateway_requests_in_flight", "Sequences admitted by the gateway", g.in_flight
        )
        yield _gauge(
            "loragate_gateway_queue_waiting", "Admitted sequences beyond max_num_seqs", g.queued
        )
        yield _gauge(
            "loragate_gateway_queue_capacity", "max_num_seqs + max_queue", g.queue_capacity
        )
        yield _gauge(
            "loragate_adapters_registered", "Adapters registered by name", g.registered_adapters
        )
        yield _gauge(
            "loragate_registry_reachable",
            "1 while the registry store (Redis) answers",
            int(g.registry_reachable),
        )
        yield _gauge(
            "loragate_usage_records_pending",
            "Usage counts waiting for the registry store to come back",
            g.usage_pending,
        )
        e = self.engine
        if e is None:
            return
        yield _gauge("loragate_num_requests_running", "Sequences in the running batch", e.running)
        yield _gauge(
            "loragate_num_requests_waiting", "Sequences waiting in the scheduler", e.waiting
        )
        mem = e.memory
        yield _gauge(
            "loragate_kv_cache_usage_perc",
            "Fraction of KV blocks allocated (0-1)",
            mem.get("utilization", 0.0),
        )
        yield _gauge(
            "loragate_kv_cache_allocated_blocks",
            "KV blocks allocated",
            mem.get("allocated_blocks", 0),
        )
        yield _gauge("loragate_kv_cache_free_blocks", "KV blocks free", mem.get("free_blocks", 0))
        yield _gauge(
            "loragate_kv_cache_total_blocks", "KV blocks in the cache", mem.get("total_blocks", 0)
        )
        yield _gauge(
            "loragate_kv_cache_cached_blocks",
            "KV blocks named in the prefix cache (held by requests, or free and reusable)",
            mem.get("cached_blocks", 0),
        )
        yield _gauge(
            "loragate_kv_cache_swapped_blocks",
            "KV blocks of preempted sequences held in CPU swap space",
            mem.get("swapped_blocks", 0),
        )
        yield _gauge(
            "loragate_kv_cache_internal_fragmentation",
            "Unused slots in the last blocks of running sequences / allocated slots (0-1)",
            mem.get("internal_fragmentation", 0.0),
        )
        yield _gauge(
            "loragate_prefix_cache_hit_rate",
            "Prompt tokens found in the prefix cache / prompt tokens looked up (0-1)",
            mem.get("prefix_cache_hit_rate", 0.0),
        )
        yield _counter(
            "loragate_prefix_cache_queried_tokens",
            "Prompt tokens looked up in the prefix cache",
            mem.get("prefix_cache_queried_tokens", 0),
        )
        yield _counter(
            "loragate_prefix_cache_hit_tokens",
            "Prompt tokens found in the prefix cache (never across tenants)",
            mem.get("prefix_cache_hit_tokens", 0),
        )
        yield _counter("loragate_prompt_tokens", "Prompt tokens accepted", e.prompt_tokens)
        yield _counter("loragate_generation_tokens", "Tokens generated", e.generation_tokens)
        yield _counter(
            "loragate_num_preemptions", "Sequences preempted for KV blocks", e.preemptions
        )
        a = e.adapters
        if a:
            loads = CounterMetricFamily(
                "loragate_adapter_loads", "Adapter loads per tier", labels=["tier"]
            )
            loads.add_metric(["cpu"], a.get("disk_loads", 0))
            loads.add_metric(["device"], a.get("slot_loads", 0))
            yield loads
            evictions = CounterMetricFamily(
                "loragate_adapter_evictions", "Adapter evictions per tier", labels=["tier"]
            )
            evictions.add_metric(["cpu"], a.get("cpu_evictions", 0))
            evictions.add_metric(["device"], a.get("device_evictions", 0))
            yield evictions
            resident = GaugeMetricFamily(
                "loragate_adapters_resident", "Adapters held per tier now", labels=["tier"]
            )
            resident.add_metric(["cpu"], a.get("cpu_adapters", 0))
            resident.add_metric(["device"], a.get("resident_adapters", 0))
            yield resident


def _gauge(name: str, doc: str, value) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def _counter(name: str, doc: str, value) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, value=value)


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self._scrape = _ScrapeCollector()
        self.registry.register(self._scrape)
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

    def observe_request(
        self, ttft: float | None, e2e: float, num_tokens: int, finish_reason: str | None
    ) -> None:
        if finish_reason is None or finish_reason == "abort":
            self.aborted.inc()
            return
        self.finished.labels(finish_reason).inc()
        self.e2e.observe(e2e)
        if ttft is not None:
            self.ttft.observe(ttft)
            if num_tokens > 1:
                self.tpot.observe((e2e - ttft) / (num_tokens - 1))

    def render(self, engine: EngineStats | None, gateway: GatewayGauges) -> bytes:
        self._scrape.engine = engine
        self._scrape.gateway = gateway
        return generate_latest(self.registry)
