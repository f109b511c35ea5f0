"""What kinds of adapters are registered (issue 45): how many of each kind and their bytes,
and, for each adapter with a label of its own (observation/labels.py), its size labelled
with its kind. Kinds are few ("lora", "dora", "lora+saved-modules"...), so the per-kind
series stay bounded whatever the number of adapters."""

from __future__ import annotations

from collections import Counter

from prometheus_client.core import GaugeMetricFamily


def adapter_kinds(
    kind_of: dict[str, str], size_of: dict[str, int], named: frozenset[str], model_name: str
):
    """`kind_of` and `size_of`: each registered adapter's key -> its kind and its bytes."""
    count, total = Counter(kind_of.values()), Counter()
    for key, kind in kind_of.items():
        total[kind] += size_of.get(key, 0)
    by_kind = GaugeMetricFamily(
        "loragate_adapters_by_kind", "Registered adapters per kind", labels=["kind"]
    )
    bytes_by_kind = GaugeMetricFamily(
        "loragate_adapter_bytes_by_kind",
        "Bytes of the registered adapters' weights per kind",
        labels=["kind"],
    )
    for kind in sorted(count):
        by_kind.add_metric([kind], count[kind])
        bytes_by_kind.add_metric([kind], total[kind])
    each = GaugeMetricFamily(
        "loragate_adapter_size_bytes",
        "The adapter's weights in bytes, with its kind (lora, dora, lora+saved-modules...)",
        labels=["model_name", "adapter", "kind"],
    )
    for key in sorted(named & kind_of.keys()):
        each.add_metric([model_name, key, kind_of[key]], size_of.get(key, 0))
    yield by_kind
    yield bytes_by_kind
    yield each
