"""/metrics by replica: each live replica's requests, KV usage, resident adapters and loads,
labelled `replica` (its Ray Serve id), beside the deployment-wide series."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from loragate.gateway.replicas.wire import ReplicaReport


class _ReplicaCollector:
    def __init__(self, reports: list[ReplicaReport]):
        self.reports = reports

    def collect(self):
        up = GaugeMetricFamily("loragate_replica_up", "Replicas reporting", labels=["replica"])
        running = GaugeMetricFamily(
            "loragate_replica_requests_running", "Sequences running", labels=["replica"]
        )
        waiting = GaugeMetricFamily(
            "loragate_replica_requests_waiting", "Sequences waiting", labels=["replica"]
        )
        kv = GaugeMetricFamily(
            "loragate_replica_kv_cache_usage", "KV blocks in use (0-1)", labels=["replica"]
        )
        resident = GaugeMetricFamily(
            "loragate_replica_adapters_resident",
            "Adapter weights in memory, by tier",
            labels=["replica", "tier"],
        )
        loads = CounterMetricFamily(
            "loragate_replica_adapter_loads",
            "Adapter loads: from files (disk) or into a slot (device)",
            labels=["replica", "tier"],
        )
        for r in self.reports:
            s, rid = r.stats, r.replica
            up.add_metric([rid], 1)
            running.add_metric([rid], s.running)
            waiting.add_metric([rid], s.waiting)
            kv.add_metric([rid], float(s.memory.get("utilization", 0.0)))
            tiers = list(s.adapter_tiers.values())
            for tier in ("device", "cpu"):
                resident.add_metric([rid, tier], tiers.count(tier))
            rows = list(s.adapter_loads.values())
            loads.add_metric([rid, "disk"], sum(row[0] for row in rows))
            loads.add_metric([rid, "device"], sum(row[2] for row in rows))
        yield from (up, running, waiting, kv, resident, loads)


def replica_metrics_text(reports: list[ReplicaReport]) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_ReplicaCollector(reports))
    return generate_latest(registry)
