"""The deployment as one engine (gateway/replicas/aggregate.py): the adapter store objects
each replica downloaded add up, as every other count does, so `ReplicatedEngine.stats()`
answers what an in-process engine's stats answer (issue 58: the gateway reads the fetch
count from the engine's stats, not from a fetcher)."""

from __future__ import annotations

from loragate.engine import EngineStats
from loragate.gateway.replicas.aggregate import combined_stats


def test_adapter_store_fetches_add_up_across_replicas():
    replicas = [EngineStats(adapter_store_fetches=n, running=1) for n in (2, 0, 3)]
    total = combined_stats(replicas)
    assert total.adapter_store_fetches == 5 and total.running == 3
    assert combined_stats([]).adapter_store_fetches == 0
