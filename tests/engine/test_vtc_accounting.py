"""VTC's accounting, whole (issue 60): prompt and generated tokens charged with separate
weights (1 and 2 by default, settable, bad values refused by name); a prompt token the
prefix cache served is not charged; under `priority`, requests of one priority are admitted
in the tenants' fair-share order, lower priorities first as in vLLM."""

from __future__ import annotations

import pytest
from fair_share_testlib import Arrival, run
from test_fair_share import (
    engine_for,
    greedy,
    prompt,
    setup,  # noqa: F401  (the module's fixture)
)

from loragate.engine import EngineConfig
from loragate.engine.core.fair_share import FairShare
from loragate.engine.core.sequence import Request
from loragate.plugins.builtin.waiting_order import priority_order


def request(tenant: str) -> Request:
    return Request(f"{tenant}-r", None, [1, 2], None, tenant=tenant)


def test_token_costs_are_settable():
    share = FairShare(prompt_token_cost=0.5, output_token_cost=3.0)
    share.arrive(request("t"), weight=2.0)
    share.charge(request("t"), prompt_tokens=10, output_tokens=4)
    assert share.served["t"] == 10 * 0.5 + 4 * 3.0
    assert share.virtual["t"] == (10 * 0.5 + 4 * 3.0) / 2.0
    for name in ("fair_prompt_token_cost", "fair_output_token_cost"):
        with pytest.raises(ValueError, match=name):
            EngineConfig(**{name: 0})


def test_a_prefix_cache_hit_is_not_charged(setup, make_llm):  # noqa: F811
    _, loras = setup
    engine = engine_for(
        setup, make_llm, "fair", fair_prompt_token_cost=1.0, fair_output_token_cost=2.0
    )
    shared = prompt(7, 64)  # four full blocks of 16
    before = engine.fair_share.served.get("T", 0.0)
    run(engine, [Arrival(0, "first", shared, "T", loras["a"], greedy(3))], greedy(3))
    first = engine.fair_share.served["T"] - before
    run(engine, [Arrival(0, "again", shared, "T", loras["a"], greedy(3))], greedy(3))
    again = engine.fair_share.served["T"] - before - first
    assert first == 64 * 1.0 + 3 * 2.0
    hit = engine.get_memory_stats()["prefix_cache_hit_tokens"]
    assert hit >= 48 and again == (64 - 48) * 1.0 + 3 * 2.0


def test_priority_orders_tenants_fairly_within_one_priority():
    def entry(seq_id, tenant, priority):
        return {"seq_id": seq_id, "tenant": tenant, "priority": priority, "cost": 10.0}

    waiting = [entry(1, "A", 1), entry(2, "A", 1), entry(3, "B", 1), entry(4, "A", 0)]
    tenants = {"A": {"service": 50.0, "weight": 1.0}, "B": {"service": 0.0, "weight": 1.0}}
    # Priority 0 first; within priority 1 the less-served B's head before A's queue.
    assert priority_order(waiting, tenants) == [4, 3, 1, 2]
    # One tenant: vLLM's order, priority then arrival.
    alone = [entry(1, "A", 1), entry(2, "A", 1), entry(5, "A", 2), entry(4, "A", 0)]
    assert priority_order(alone, tenants) == [4, 1, 2, 5]
