"""Staging: a loader thread copies weights into a free device slot, so no step copies them.

The copy runs without the cache's lock into a reserved slot that nothing else takes; the
weights count as resident only once the copy is whole, and an adapter removed meanwhile is
never published.
"""

from __future__ import annotations

import pytest
import torch

from loragate.adapters import AdapterCache, AdapterNotInMemory, LoadPacing, LoRARequest
from loragate.adapters.loader import load_adapter


@pytest.fixture
def requests(make_adapter):
    return [
        LoRARequest(name, i + 1, str(make_adapter(name, seed=i, rank=4 + 2 * i)))
        for i, name in enumerate(["a", "b", "c"])
    ]


def during_copy(action):
    """A pacing whose pause (one per module copied) runs ``action`` once, mid-copy."""
    calls = []

    def sleep(_seconds: float) -> None:
        if not calls:
            calls.append(action())

    return LoadPacing(busy=lambda: True, sleep=sleep), calls


def test_staged_weights_are_in_a_slot_before_any_step_asks(spec, requests):
    cache = AdapterCache(spec, max_loras=2, max_lora_rank=8, max_cpu_loras=3)
    identity = cache.preload(requests[0]).identity
    assert cache.stage(identity) is True
    stats = cache.stats()
    assert stats["staged_slot_loads"] == 1 and stats["slot_loads"] == 1, stats
    assert cache.stage(identity) is True, "already in a slot: nothing to copy"
    assert cache.stats()["slot_loads"] == 1

    slot = cache.acquire(requests[0], identity=identity, read_files=False)
    assert cache.stats()["device_hits"] == 1, "the step found the weights in their slot"
    expected = load_adapter(requests[0].lora_path, spec, 8)
    a, b = expected.weights[(0, "q_proj")]
    assert torch.equal(cache.lora_a(0, "q_proj")[slot, : a.shape[0]], a)
    assert torch.equal(cache.lora_b(0, "q_proj")[slot, :, : b.shape[1]], b)
    assert float(cache.scales[slot]) == expected.scale


def test_staging_takes_no_slot_in_use_and_evicts_nothing(spec, requests):
    cache = AdapterCache(spec, max_loras=1, max_lora_rank=8, max_cpu_loras=3)
    cache.acquire(requests[0])
    other = cache.preload(requests[1]).identity
    assert cache.stage(other) is False, "the only slot is taken: the step copies, not staging"
    assert cache.slot_of(requests[0]) == 0 and cache.slot_of(requests[1]) is None
    assert cache.stats()["device_evictions"] == 0


def test_the_step_never_takes_weights_half_copied(spec, requests):
    cache = AdapterCache(spec, max_loras=2, max_lora_rank=8, max_cpu_loras=3)
    identity = cache.preload(requests[0]).identity

    def step_asks():
        with pytest.raises(AdapterNotInMemory):
            cache.acquire(requests[0], identity=identity, read_files=False)
        return cache.stats()["resident_adapters"]

    pacing, calls = during_copy(step_asks)
    cache.load_pacing = pacing
    assert cache.stage(identity) is True
    assert calls == [0], "mid-copy, nothing is resident yet"
    assert cache.acquire(requests[0], identity=identity, read_files=False) == cache.slot_of(
        requests[0]
    )


def test_weights_removed_while_staged_are_never_published(spec, requests):
    cache = AdapterCache(spec, max_loras=2, max_lora_rank=8, max_cpu_loras=3)
    identity = cache.preload(requests[1]).identity
    pacing, calls = during_copy(lambda: cache.remove(requests[1]))
    cache.load_pacing = pacing
    assert cache.stage(identity) is False
    assert calls == [True], "the removal found the weights (CPU tier)"
    stats = cache.stats()
    assert stats["resident_adapters"] == 0 and stats["slot_loads"] == 0, stats
    assert not cache.scales.any(), "the half-written slot was zeroed"
    assert not any(cache.lora_a(0, m).any() for m in spec.modules)
    # Both slots are free again.
    first = cache.acquire(requests[0])
    second = cache.acquire(requests[2])
    assert {first, second} == {0, 1}
