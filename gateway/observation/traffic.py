"""Per-request series: vLLM's (`vllm:` names, a `model_name` label) and loragate's own per
adapter and per tenant. All are observed from the same finished (or aborted) request, so
the per-adapter and per-tenant counters add up to the `vllm:` totals by construction.
Adapter and tenant label values are bounded (observation/labels.py)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Histogram

from loragate.gateway.observation.labels import BoundedLabels
from loragate.gateway.observation.minute_window import MinuteWindow

LATENCY_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
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
TOKEN_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
# Fewer buckets for the per-adapter and per-tenant histograms: they multiply by labels.
COARSE_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


@dataclass
class RequestRecord:
    """One engine request as it ended. `adapter` is its key or labels.BASE."""

    adapter: str
    tenant: str
    finish_reason: str | None
    prompt_tokens: int
    generation_tokens: int
    e2e: float
    ttft: float | None = None
    queue_time: float | None = None
    token_gaps: list[float] = field(default_factory=list)
    output_len: int = 0  # tokens of its longest output (n > 1)


class _Family:
    """requests, prompt and generation tokens, TTFT, ITL and queue time by one label."""

    def __init__(self, registry: CollectorRegistry, who: str, label: str):
        labels = ["model_name", label]
        prefix = f"loragate_{who}"
        self.requests = Counter(
            f"{prefix}_requests",
            f"Requests ended (finished or aborted), by {label}",
            labels,
            registry=registry,
        )
        self.prompt_tokens = Counter(
            f"{prefix}_prompt_tokens",
            f"Prompt tokens of ended requests, by {label}",
            labels,
            registry=registry,
        )
        self.generation_tokens = Counter(
            f"{prefix}_generation_tokens",
            f"Tokens generated, by {label}",
            labels,
            registry=registry,
        )
        self.ttft = Histogram(
            f"{prefix}_time_to_first_token_seconds",
            f"Time to first token, by {label}",
            labels,
            buckets=COARSE_BUCKETS,
            registry=registry,
        )
        self.itl = Histogram(
            f"{prefix}_inter_token_latency_seconds",
            f"Time between output tokens, by {label}",
            labels,
            buckets=COARSE_BUCKETS,
            registry=registry,
        )
        self.queue = Histogram(
            f"{prefix}_queue_time_seconds",
            f"From arrival at the engine to its first step, by {label}",
            labels,
            buckets=COARSE_BUCKETS,
            registry=registry,
        )
        self.series = (
            self.prompt_tokens,
            self.generation_tokens,
            self.ttft,
            self.itl,
            self.queue,
        )


def _observe(series: tuple, labels: tuple, r: RequestRecord) -> None:
    """One request into (prompt tokens, generation tokens, TTFT, ITL, queue time)."""
    prompt, generated, ttft, itl, queue = (metric.labels(*labels) for metric in series)
    prompt.inc(r.prompt_tokens)
    generated.inc(r.generation_tokens)
    if r.ttft is not None:
        ttft.observe(r.ttft)
    if r.queue_time is not None:
        queue.observe(r.queue_time)
    for gap in r.token_gaps:
        itl.observe(gap)


class RequestTraffic:
    def __init__(self, registry: CollectorRegistry, model_name: str, label_limit: int):
        self.model_name = model_name
        self.adapter_labels = BoundedLabels(label_limit)
        self.tenant_labels = BoundedLabels(label_limit)
        self.adapter = _Family(registry, "adapter", "adapter")
        # What the dashboard shows: [requests, prompt, generated tokens] per label, and the
        # latest TTFTs.
        self.by_adapter: dict[str, list[int]] = {}
        self.by_tenant: dict[str, list[int]] = {}
        self.rate_limited_by_tenant: dict[str, int] = {}  # requests a quota refused (429)
        self.recent_ttft: deque[float] = deque(maxlen=256)
        # Each tenant's own name (not its label), for usage against its per-minute quota.
        self.tenant_minute = MinuteWindow()
        self.tenant = _Family(registry, "tenant", "tenant")
        m = ["model_name"]
        self.prompt_tokens = Counter(
            "vllm:prompt_tokens", "Prompt tokens of ended requests", m, registry=registry
        )
        self.generation_tokens = Counter(
            "vllm:generation_tokens", "Tokens generated", m, registry=registry
        )
        self.rate_limited = Counter(
            "loragate_tenant_rate_limited",
            "Requests a tenant's quota refused (429 with Retry-After), by tenant and quota "
            "(tokens_per_minute, requests_per_minute, max_concurrent_requests)",
            m + ["tenant", "reason"],
            registry=registry,
        )
        self.success = Counter(
            "vllm:request_success",
            "Requests finished, by finish reason",
            m + ["finished_reason"],
            registry=registry,
        )
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds",
            "Time to first token",
            m,
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.itl = Histogram(
            "vllm:inter_token_latency_seconds",
            "Time between output tokens",
            m,
            buckets=TOKEN_BUCKETS,
            registry=registry,
        )
        self.queue = Histogram(
            "vllm:request_queue_time_seconds",
            "From arrival at the engine to its first step",
            m,
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.e2e = Histogram(
            "vllm:e2e_request_latency_seconds",
            "From arrival at the gateway to the last token",
            m,
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )

    def count_rate_limited(self, tenant: str, reason: str) -> None:
        """A quota refused one of `tenant`'s requests (429), for `reason`."""
        label = self.tenant_labels.label(tenant)
        self.rate_limited.labels(self.model_name, label, reason).inc()
        self.rate_limited_by_tenant[label] = self.rate_limited_by_tenant.get(label, 0) + 1

    def observe(self, r: RequestRecord) -> None:
        model = self.model_name
        adapter = self.adapter_labels.label(r.adapter)
        tenant = self.tenant_labels.label(r.tenant)
        totals = (self.prompt_tokens, self.generation_tokens, self.ttft, self.itl, self.queue)
        _observe(totals, (model,), r)
        for family, value in ((self.adapter, adapter), (self.tenant, tenant)):
            family.requests.labels(model, value).inc()
            _observe(family.series, (model, value), r)
        for table, key in ((self.by_adapter, adapter), (self.by_tenant, tenant)):
            row = table.setdefault(key, [0, 0, 0])
            row[0] += 1
            row[1] += r.prompt_tokens
            row[2] += r.generation_tokens
        if r.ttft is not None:
            self.recent_ttft.append(r.ttft)
        self.tenant_minute.add(r.tenant, r.prompt_tokens + r.generation_tokens)
        if r.finish_reason not in (None, "abort"):
            self.success.labels(model, r.finish_reason).inc()
            self.e2e.labels(model).observe(r.e2e)


def request_record(gen, adapter: str, tenant: str) -> RequestRecord:
    """What the metrics keep of one closed serving.Generation (its latest output is set)."""
    out = gen.latest
    queue_time = None
    m = out.metrics
    if m is not None and m.first_scheduled_time is not None:
        queue_time = max(0.0, m.first_scheduled_time - m.arrival_time)
    return RequestRecord(
        adapter=adapter,
        tenant=tenant,
        finish_reason=out.outputs[0].finish_reason if gen.finished else None,
        prompt_tokens=len(out.prompt_token_ids or ()),
        generation_tokens=sum(len(c.token_ids) for c in out.outputs),
        e2e=(gen.finished_at or gen.started) - gen.started,
        ttft=None if gen.first_token_at is None else gen.first_token_at - gen.started,
        queue_time=queue_time,
        token_gaps=list(gen.token_gaps),
        output_len=gen.num_output_tokens,
    )
