"""Per-tenant preemptions on /metrics (issue 60): the engine's counts by tenant, summed
across replicas, as `loragate_tenant_preemptions_total`; and speculative decoding's counts
(issue 61) summed across replicas per adapter and method."""

from __future__ import annotations

from loragate.engine import EngineStats
from loragate.gateway.observation.metrics import GatewayMetrics
from loragate.gateway.observation.scrape import GatewayGauges
from loragate.gateway.replicas.aggregate import combined_stats


def test_preemptions_by_tenant_are_counted_and_summed_across_replicas():
    one = EngineStats(tenant_preemptions={"acme": 2}, tenant_service={"acme": 10.0})
    two = EngineStats(tenant_preemptions={"acme": 1, "globex": 4}, tenant_service={"acme": 5.0})
    total = combined_stats([one, two])
    assert total.tenant_preemptions == {"acme": 3, "globex": 4}
    assert total.tenant_service == {"acme": 15.0}
    text = GatewayMetrics("m").render(total, GatewayGauges()).decode()
    assert 'loragate_tenant_preemptions_total{model_name="m",tenant="acme"} 3.0' in text
    assert 'loragate_tenant_preemptions_total{model_name="m",tenant="globex"} 4.0' in text


def test_spec_decode_counts_add_up_across_replicas():
    one = EngineStats(spec_decode={("sql", "ngram"): (2, 8, 6, (2, 2, 1, 1))})
    two = EngineStats(
        spec_decode={("sql", "ngram"): (1, 2, 1, (1, 0)), (None, "ngram"): (1, 1, 0, (0,))}
    )
    total = combined_stats([one, two])
    assert total.spec_decode == {
        ("sql", "ngram"): (3, 10, 7, (3, 2, 1, 1)),
        (None, "ngram"): (1, 1, 0, (0,)),
    }
    text = GatewayMetrics("m").render(total, GatewayGauges()).decode()
    labels = 'lora_name="sql",method="ngram",model_name="m"'
    assert f"vllm:spec_decode_num_accepted_tokens_total{{{labels}}} 7.0" in text
    assert f"loragate_spec_decode_acceptance_rate{{{labels}}} 0.7" in text
