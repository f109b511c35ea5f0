"""The gauges and counters read at scrape time: the gateway's own, and the engine's stats
snapshot (queues, KV blocks, adapter residency). Each is one row of a table below: its
name, its help, and where its value comes from."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from loragate.engine import EngineStats
from loragate.gateway.observation.adapter_kinds import adapter_kinds
from loragate.gateway.observation.labels import BoundedLabels


@dataclass
class GatewayGauges:
    in_flight: int = 0
    queued: int = 0
    queue_capacity: int = 0
    registered_adapters: int = 0
    engine_up: bool = True
    registry_reachable: bool = True
    usage_pending: int = 0
    registry_durable: bool = False
    registry_backup_at: float = 0.0  # unix time of the newest registry backup; 0: none


@dataclass
class AdapterView:
    """The registered adapters' weights, key -> sha256 (and kind and bytes), and the
    engine's device slots."""

    sha256_of: dict[str, str] = field(default_factory=dict)
    kind_of: dict[str, str] = field(default_factory=dict)
    size_of: dict[str, int] = field(default_factory=dict)
    max_loras: int = 0


G, C = GaugeMetricFamily, CounterMetricFamily

# (kind, name, help, GatewayGauges field)
_GATEWAY = (
    (G, "loragate_engine_up", "1 while the engine thread runs", "engine_up"),
    (G, "loragate_gateway_requests_in_flight", "Sequences admitted by the gateway", "in_flight"),
    (G, "loragate_gateway_queue_waiting", "Admitted sequences beyond max_num_seqs", "queued"),
    (G, "loragate_gateway_queue_capacity", "max_num_seqs + max_queue", "queue_capacity"),
    (G, "loragate_adapters_registered", "Adapters registered by name", "registered_adapters"),
    (
        G,
        "loragate_registry_reachable",
        "1 while the registry store (Redis) answers",
        "registry_reachable",
    ),
    (
        G,
        "loragate_usage_records_pending",
        "Usage counts waiting for the registry store to come back",
        "usage_pending",
    ),
    (
        G,
        "loragate_registry_durable",
        "1 if the registry store said at start that it keeps the registry over a restart",
        "registry_durable",
    ),
    (
        G,
        "loragate_registry_last_backup_timestamp_seconds",
        "Unix time of the newest registry backup in --registry-backup-dir (0: none)",
        "registry_backup_at",
    ),
)

# (kind, name, help, EngineStats field, or key of its `memory` dict)
_ENGINE = (
    (G, "loragate_num_requests_running", "Sequences in the running batch", "running"),
    (G, "loragate_num_requests_waiting", "Sequences waiting in the scheduler", "waiting"),
    (G, "loragate_kv_cache_usage_perc", "Fraction of KV blocks allocated (0-1)", "utilization"),
    (G, "loragate_kv_cache_allocated_blocks", "KV blocks allocated", "allocated_blocks"),
    (G, "loragate_kv_cache_free_blocks", "KV blocks free", "free_blocks"),
    (G, "loragate_kv_cache_total_blocks", "KV blocks in the cache", "total_blocks"),
    (
        G,
        "loragate_kv_cache_cached_blocks",
        "KV blocks named in the prefix cache (held by requests, or free and reusable)",
        "cached_blocks",
    ),
    (
        G,
        "loragate_kv_cache_swapped_blocks",
        "KV blocks of preempted sequences held in CPU swap space",
        "swapped_blocks",
    ),
    (
        G,
        "loragate_kv_cache_internal_fragmentation",
        "Unused slots in the last blocks of running sequences / allocated slots (0-1)",
        "internal_fragmentation",
    ),
    (
        G,
        "loragate_prefix_cache_hit_rate",
        "Prompt tokens found in the prefix cache / prompt tokens looked up (0-1)",
        "prefix_cache_hit_rate",
    ),
    (
        C,
        "loragate_prefix_cache_queried_tokens",
        "Prompt tokens looked up in the prefix cache",
        "prefix_cache_queried_tokens",
    ),
    (
        C,
        "loragate_prefix_cache_hit_tokens",
        "Prompt tokens found in the prefix cache (never across tenants)",
        "prefix_cache_hit_tokens",
    ),
    (C, "loragate_prompt_tokens", "Prompt tokens accepted", "prompt_tokens"),
    (C, "loragate_generation_tokens", "Tokens generated", "generation_tokens"),
    (C, "loragate_num_preemptions", "Sequences preempted for KV blocks", "preemptions"),
)

# (kind, name, help, key of the CPU tier's count, key of the device tier's) in `adapters`
_TIERS = (
    (C, "loragate_adapter_loads", "Adapter loads per tier", "disk_loads", "slot_loads"),
    (
        C,
        "loragate_adapter_evictions",
        "Adapter evictions per tier",
        "cpu_evictions",
        "device_evictions",
    ),
    (
        G,
        "loragate_adapters_resident",
        "Adapters held per tier now",
        "cpu_adapters",
        "resident_adapters",
    ),
)


class ScrapeCollector:
    """Yields the engine snapshot and gateway gauges taken just before the scrape."""

    def __init__(self, model_name: str = "", labels: BoundedLabels | None = None) -> None:
        self.engine: EngineStats | None = None
        self.gateway = GatewayGauges()
        self.adapters = AdapterView()
        self.model_name = model_name
        self.labels = labels or BoundedLabels(0)
        self.base_weights: tuple[str, tuple[tuple[str, int], ...]] | None = None

    def collect(self):
        for kind, name, doc, attr in _GATEWAY:
            yield kind(name, doc, value=int(getattr(self.gateway, attr)))
        if self.base_weights is not None:
            yield base_weight_bytes(*self.base_weights, self.model_name)
        view = self.adapters
        yield from adapter_kinds(view.kind_of, view.size_of, self.labels.named(), self.model_name)
        e = self.engine
        if e is None:
            return
        for kind, name, doc, attr in _ENGINE:
            value = getattr(e, attr) if hasattr(e, attr) else e.memory.get(attr, 0)
            yield kind(name, doc, value=value)
        if e.adapters:
            for kind, name, doc, cpu, device in _TIERS:
                family = kind(name, doc, labels=["tier"])
                family.add_metric(["cpu"], e.adapters.get(cpu, 0))
                family.add_metric(["device"], e.adapters.get(device, 0))
                yield family
        yield from vllm_gauges(e, self.model_name)
        yield lora_requests_info(e, self.adapters.max_loras)
        if e.adapters:
            yield from adapter_tiers(e, self.adapters, self.labels, self.model_name)


def base_weight_bytes(quantization: str, held: tuple[tuple[str, int], ...], model_name: str):
    """Bytes of the base's weights held, per tensor type, labelled with its quantization."""
    family = G(
        "loragate_base_weight_bytes",
        "Bytes of the base model's weights held, by tensor type (a block type such as "
        "I4_G128 or Q4_1, or a dtype) and quantization (awq, gptq, int8, int4, gguf, none)",
        labels=["model_name", "quantization", "type"],
    )
    for kind, size in held:
        family.add_metric([model_name, quantization, kind], size)
    return family


def vllm_gauges(e: EngineStats, model_name: str):
    """vLLM's names for the queues and the KV cache, for dashboards and routers."""
    for name, doc, value in (
        ("vllm:num_requests_running", "Sequences in the running batch", e.running),
        ("vllm:num_requests_waiting", "Sequences waiting in the scheduler", e.waiting),
        (
            "vllm:kv_cache_usage_perc",
            "Fraction of KV blocks allocated (0-1)",
            e.memory.get("utilization", 0),
        ),
    ):
        family = G(name, doc, labels=["model_name"])
        family.add_metric([model_name], value)
        yield family


def lora_requests_info(e: EngineStats, max_loras: int):
    """vLLM's info series: the adapters running and waiting now, comma-separated; its value
    is the time of the snapshot, as in vLLM (routers pick the newest)."""
    family = G(
        "vllm:lora_requests_info",
        "Running and waiting LoRA adapters (value: when this was read)",
        labels=["running_lora_adapters", "max_lora", "waiting_lora_adapters"],
    )
    running = ",".join(sorted(e.busy_adapters))
    waiting = ",".join(sorted(e.waiting_adapters))
    family.add_metric([running, str(max_loras), waiting], time.time())
    return family


def adapter_tiers(e: EngineStats, view: AdapterView, labels: BoundedLabels, model_name: str):
    """Where each registered adapter's weights are: a count per tier for all of them, and a
    1 on the tier of each adapter that has a label of its own (observation/labels.py)."""
    counts = {"device": 0, "cpu": 0, "disk": 0}
    named = labels.named()
    each = G(
        "loragate_adapter_tier",
        "1 on the tier the adapter's weights are in (device slot, cpu or disk)",
        labels=["model_name", "adapter", "tier"],
    )
    for key, sha256 in sorted(view.sha256_of.items()):
        tier = e.adapter_tiers.get(sha256, "disk")
        counts[tier] += 1
        if key in named:
            each.add_metric([model_name, key, tier], 1)
    loads = C(
        "loragate_adapter_weight_loads",
        "Loads of the adapter's weights into a tier (cpu: read from disk; device: a slot)",
        labels=["model_name", "adapter", "tier"],
    )
    load_seconds = C(
        "loragate_adapter_weight_load_seconds",
        "Seconds spent loading the adapter's weights into a tier",
        labels=["model_name", "adapter", "tier"],
    )
    for key, sha256 in sorted(view.sha256_of.items()):
        row = e.adapter_loads.get(sha256)
        if key in named and row is not None:
            for tier, count, seconds in (("cpu", row[0], row[1]), ("device", row[2], row[3])):
                loads.add_metric([model_name, key, tier], count)
                load_seconds.add_metric([model_name, key, tier], seconds)
    yield loads
    yield load_seconds
    total = G("loragate_adapters_by_tier", "Registered adapters per tier now", labels=["tier"])
    for tier, n in counts.items():
        total.add_metric([tier], n)
    yield total
    yield each
    for name, doc, key in (
        ("loragate_adapter_load_seconds", "Time spent reading adapters from disk", "load_seconds"),
        (
            "loragate_adapter_slot_load_seconds",
            "Time spent copying adapters into device slots",
            "slot_load_seconds",
        ),
    ):
        yield C(name, doc, value=e.adapters.get(key, 0.0))
