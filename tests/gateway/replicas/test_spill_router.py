"""The spill rule of the replicas' routing (issue 46): a request for an adapter whose
holders are all busy goes to an idle replica, which loads it too; otherwise it is routed
as Ray Serve routes it. The rule is checked on the router's own state (no cluster), and
its counts on the hooks Ray Serve's router calls around each request."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

import pytest
from ray.serve._private.common import DeploymentID
from ray.serve.request_router import ReplicaID

from loragate.gateway.replicas.spill_router import SpillRouter
from loragate.gateway.settings import GatewaySettings

DEPLOYMENT = DeploymentID("EngineReplica", "loragate")
A, B, C = (ReplicaID(name, DEPLOYMENT) for name in ("a", "b", "c"))


def router(held: dict[str, set], spill_at: int = 3, idle_at: int = 1) -> SpillRouter:
    """A SpillRouter's state alone: replicas a, b, c and what each holds."""
    r = SpillRouter.__new__(SpillRouter)
    r.spill_at, r.idle_at, r.spilled = spill_at, idle_at, 0
    r._replica_id_set = {A, B, C}
    r._multiplexed_model_id_to_replica_ids = held
    r._use_replica_queue_len_cache = False
    r.in_flight = Counter()
    return r


def request(model: str) -> SimpleNamespace:
    return SimpleNamespace(metadata=SimpleNamespace(multiplexed_model_id=model))


def test_busy_holders_spill_to_the_least_loaded_idle_replica():
    r = router({"hot": {A}})
    r.in_flight.update({A: 3, B: 1, C: 0})
    assert r.spill_target(request("hot")) == C
    r.in_flight[C] = 2  # no longer idle
    assert r.spill_target(request("hot")) == B
    r.in_flight[B] = 2
    assert r.spill_target(request("hot")) is None, "nobody idle: Ray Serve's routing"


def test_no_spill_below_the_threshold_or_without_an_adapter():
    r = router({"hot": {A, B}})
    r.in_flight.update({A: 5, B: 2, C: 0})
    assert r.spill_target(request("hot")) is None, "one holder is not busy"
    r.in_flight[B] = 3
    assert r.spill_target(request("hot")) == C
    assert r.spill_target(request("")) is None, "a base-model request"
    assert r.spill_target(None) is None
    assert r.spill_target(request("cold")) is None, "held nowhere: Ray Serve places it"


def test_counts_follow_sends_ends_and_the_replicas_own_reports():
    r = router({})
    for _ in range(3):
        r.on_send_request(A)
    r.decrement_queue_len_cache(A)
    assert r.in_flight[A] == 2
    r.on_new_queue_len_info(A, 7)
    assert r.in_flight[A] == 7
    for _ in range(9):
        r.decrement_queue_len_cache(A)
    assert r.in_flight[A] == 0


def test_spill_options_reach_the_router_config():
    from loragate.gateway.replicas.cluster import RayReplicas

    config = RayReplicas(GatewaySettings(replicas=2, spill_at=4, spill_idle_at=0))._router()
    routing = config["request_router_config"]
    assert routing.request_router_kwargs == {"spill_at": 4, "idle_at": 0}
    assert "SpillRouter" in str(routing.request_router_class)
    assert RayReplicas(GatewaySettings(replicas=2, spill_at=0))._router() == {}  # off
    with pytest.raises(ValueError, match="spill_at"):
        GatewaySettings(replicas=2, spill_at=-1)


def test_by_default_a_full_batch_spills_to_a_replica_at_most_half_full():
    """Issue 60: a flooding tenant's adapter spreads once its replica's batch is full,
    instead of queueing there while another replica idles; below that, affinity holds."""
    from loragate.engine import EngineConfig
    from loragate.gateway.replicas.cluster import RayReplicas

    settings = GatewaySettings(replicas=2, engine=EngineConfig(max_num_seqs=8))
    routing = RayReplicas(settings)._router()["request_router_config"]
    assert "SpillRouter" in str(routing.request_router_class)
    assert routing.request_router_kwargs == {"spill_at": 8, "idle_at": 4}
    r = router({"flood": {A}}, **routing.request_router_kwargs)
    r.in_flight.update({A: 7, B: 5, C: 6})
    assert r.spill_target(request("flood")) is None  # A's batch has room: affinity
    r.on_send_request(A)
    assert r.spill_target(request("flood")) is None  # B and C are more than half full
    r.decrement_queue_len_cache(B)
    assert r.spill_target(request("flood")) == B
