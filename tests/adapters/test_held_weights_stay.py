"""Weights an admitted request holds stay in the CPU tier until it ends, and nothing is read
into a tier they fill (issue 46: the fleet check run read each adapter's files about eleven
times, 1542 disk loads for 240 requests, because each load for a waiting request evicted
another waiting request's weights, whose own load later evicted a third's).

Files are settled (older than the identity book's racy window) so a stat vouches for them,
as for every adapter a server has served a while: that is when held weights used to leave."""

from __future__ import annotations

import time

import pytest

from loragate.adapters import LoRARequest
from loragate.adapters import identity as identity_module
from loragate.engine.lora.adapter_residency import AdapterResidency

RACY_NS = 50_000_000


@pytest.fixture(autouse=True)
def short_racy_window(monkeypatch):
    monkeypatch.setattr(identity_module, "RACY_NS", RACY_NS)


@pytest.fixture
def requests(make_adapter):
    made = [make_adapter(f"h{i}", rank=4, seed=i + 1) for i in range(4)]
    time.sleep(RACY_NS / 1e9 + 0.02)
    return [LoRARequest(f"h{i}", i + 1, str(path)) for i, path in enumerate(made)]


def admitted(residency: AdapterResidency, request: LoRARequest):
    identity = residency.admission_identity(request)
    residency.hold_weights(identity)
    return identity


def test_held_weights_never_leave_for_another_requests_weights(spec, requests):
    residency = AdapterResidency(spec, max_loras=1, max_lora_rank=8, max_cpu_loras=2)
    first, second = (admitted(residency, r) for r in requests[:2])
    assert residency.known_identity(requests[0]) == first  # a stat vouches for the files

    # A third admitted request's weights are read (to validate them) but not kept.
    third = admitted(residency, requests[2])
    assert residency.in_memory(first) and residency.in_memory(second)
    assert not residency.in_memory(third)
    assert residency.counts()["cpu_adapters"] == 2 and residency.counts()["cpu_evictions"] == 0
    # ... and its load waits for room: none while both held weights are needed.
    assert not residency.room_to_load()
    residency.load(requests[1], second)  # in memory: no read
    assert residency.counts()["file_reads"] == 3

    # The first request ends: its weights may leave, and the third's load has room.
    residency.release_weights(first)
    assert residency.room_to_load() and not residency.room_to_load(loading=1)
    residency.load(requests[2], third)
    assert (
        residency.in_memory(third)
        and residency.in_memory(second)
        and not residency.in_memory(first)
    )
    assert residency.counts()["file_reads"] == 4 and residency.counts()["cpu_evictions"] == 1


def test_a_request_for_weights_no_longer_in_memory_is_admitted_by_a_stat(spec, requests):
    residency = AdapterResidency(spec, max_loras=1, max_lora_rank=8, max_cpu_loras=1)
    first = residency.admission_identity(requests[0])
    residency.admission_identity(requests[1])  # evicts the first: nothing holds it
    assert not residency.in_memory(first)
    reads = residency.counts()["file_reads"]
    assert residency.admission_identity(requests[0]) == first
    assert residency.counts()["file_reads"] == reads  # admitted without a read: its load reads it
