"""Speculative decoding's counters, read from the engine at scrape time, as vLLM names them
(`vllm:spec_decode_num_drafts`, `..._num_draft_tokens`, `..._num_accepted_tokens`,
`..._num_accepted_tokens_per_pos`), each labelled with the adapter (observation/labels.py's
bound; BASE for base rows) and the proposer method; and loragate's acceptance rate gauge
per adapter and method."""

from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from loragate.engine import EngineStats
from loragate.gateway.observation.labels import BASE, BoundedLabels


class SpecDecodeCollector:
    def __init__(self, model_name: str, labels: BoundedLabels) -> None:
        self.engine: EngineStats | None = None
        self.model_name = model_name
        self.labels = labels

    def collect(self):
        e = self.engine
        if e is None or not e.spec_decode:
            return
        grouped: dict[tuple[str, str], list] = {}
        for (adapter, method), counts in e.spec_decode.items():
            key = (self.labels.label(adapter or BASE), method)
            total = grouped.setdefault(key, [0, 0, 0, []])
            for i in range(3):
                total[i] += counts[i]
            per_position = total[3]
            per_position.extend([0] * (len(counts[3]) - len(per_position)))
            for i, n in enumerate(counts[3]):
                per_position[i] += n
        names = ["model_name", "lora_name", "method"]
        families = [
            CounterMetricFamily(
                "vllm:spec_decode_num_drafts", "Rows that speculated, one per step", labels=names
            ),
            CounterMetricFamily(
                "vllm:spec_decode_num_draft_tokens", "Proposed tokens verified", labels=names
            ),
            CounterMetricFamily(
                "vllm:spec_decode_num_accepted_tokens", "Proposed tokens accepted", labels=names
            ),
        ]
        per_pos = CounterMetricFamily(
            "vllm:spec_decode_num_accepted_tokens_per_pos",
            "Proposed tokens accepted at each position of a proposal",
            labels=[*names, "position"],
        )
        rate = GaugeMetricFamily(
            "loragate_spec_decode_acceptance_rate",
            "Accepted over proposed tokens since start",
            labels=names,
        )
        for (label, method), (drafts, draft_tokens, accepted, per_position) in grouped.items():
            values = [self.model_name, label, method]
            for family, value in zip(families, (drafts, draft_tokens, accepted), strict=True):
                family.add_metric(values, value)
            for position, n in enumerate(per_position):
                per_pos.add_metric([*values, str(position)], n)
            rate.add_metric(values, accepted / draft_tokens if draft_tokens else 0.0)
        yield from families
        yield per_pos
        yield rate
