"""Adapters count at their real size in the CPU tier and the device slots (issue 45): one
carrying whole embedding and output matrices (modules_to_save) takes the room of several
plain ones, eviction frees as much as it needs, one larger than a whole tier is refused
naming the sizes, and nothing of what leaves is left behind (adapters/tier_budget.py)."""

from __future__ import annotations

import pytest
import torch
from test_adapter_tiers import ALL, adds_nothing, slot_reads
from tiers_testlib import in_slots, names_in_slots

from loragate.adapters import AdapterTooLargeError, LoRARequest, load_adapter
from loragate.adapters.tier_budget import cpu_bytes, largest_bytes, slot_bytes, unit_bytes
from loragate.engine.lora.adapter_residency import AdapterResidency

RANK = 2  # max_lora_rank: a small unit, so whole matrices weigh several units


@pytest.fixture
def made(make_adapter):
    """Four plain rank-2 adapters on every module and two with whole copies of embed_tokens
    and lm_head (and a rank-2 LoRA on q_proj), as requests."""
    requests = {}
    for i, name in enumerate(["p1", "p2", "p3", "p4"]):
        requests[name] = LoRARequest(
            name, i + 1, str(make_adapter(name, rank=2, targets=ALL, seed=i))
        )
    for i, name in enumerate(["s1", "s2"]):
        path = make_adapter(
            name,
            rank=2,
            targets=["q_proj"],
            modules_to_save=["embed_tokens", "lm_head"],
            seed=9 + i,
        )
        requests[name] = LoRARequest(name, 10 + i, str(path))
    return requests


def residency_of(spec, **kwargs) -> AdapterResidency:
    kwargs.setdefault("max_loras", 3)
    kwargs.setdefault("max_cpu_loras", 3)
    return AdapterResidency(spec, max_lora_rank=RANK, **kwargs)


def cpu_names(residency) -> list[str]:
    return [r.lora_name for r in residency.cpu_resident()]


def test_sizes_are_the_tensors_held(spec, made):
    plain = load_adapter(made["p1"].lora_path, spec, RANK)
    saved = load_adapter(made["s1"].lora_path, spec, RANK)
    vocab, hidden = spec.vocab_size, spec.hidden_size
    per_layer_plain = 2 * sum(RANK * (i + o) for i, o in spec.modules.values()) * 4
    assert cpu_bytes(plain) == slot_bytes(plain, torch.float32) == per_layer_plain
    assert slot_bytes(plain, torch.bfloat16) == per_layer_plain // 2
    q_in, q_out = spec.modules["q_proj"]
    tables = 2 * vocab * hidden * 4
    assert cpu_bytes(saved) == tables + 2 * RANK * (q_in + q_out) * 4
    # In bfloat16 slots the saved matrices are bfloat16 too (VocabExtras.to).
    assert slot_bytes(saved, torch.bfloat16) == tables // 2 + 2 * RANK * (q_in + q_out) * 2
    unit = unit_bytes(spec, RANK, torch.float32)
    assert per_layer_plain < unit < cpu_bytes(saved) / 2, "a saved adapter weighs 2+ units"
    assert cpu_bytes(saved) < largest_bytes(spec, RANK, torch.float32, torch.float32)


def test_a_saved_modules_adapter_evicts_several_plain_ones_from_the_cpu_tier(spec, made):
    unit = unit_bytes(spec, RANK, torch.float32)
    residency = residency_of(spec, max_cpu_lora_bytes=3 * unit)
    for name in ("p1", "p2", "p3"):
        residency.preload(made[name])
    assert cpu_names(residency) == ["p1", "p2", "p3"], "three plain adapters fit, as before"
    residency.preload(made["s1"])
    assert cpu_names(residency) == ["s1"], "room for it took all three plain ones"
    stats = residency.counts()
    assert stats["cpu_evictions"] == 3
    assert stats["cpu_bytes"] == cpu_bytes(load_adapter(made["s1"].lora_path, spec, RANK))
    assert stats["cpu_bytes"] <= 3 * unit
    residency.preload(made["p4"])  # the saved one leaves only once plain ones do not fit beside it
    assert cpu_names(residency) == ["p4"]


def test_default_budget_holds_one_saved_adapter_beside_plain_ones_not_two(spec, made):
    """By default a tier holds its count of plain adapters, one of which may be the largest
    kind: a second saved-modules adapter evicts plain ones until its bytes fit."""
    residency = residency_of(spec)
    unit = unit_bytes(spec, RANK, torch.float32)
    largest = largest_bytes(spec, RANK, torch.float32, torch.float32)
    assert residency.cpu_budget.limit == 2 * unit + largest
    for name in ("p1", "p2", "s1"):
        residency.preload(made[name])
    assert cpu_names(residency) == ["p1", "p2", "s1"], "one saved beside plain ones fits"
    residency.preload(made["s2"])
    assert cpu_names(residency) == ["s1", "s2"], "a second saved one took two plain ones' room"
    assert residency.counts()["cpu_evictions"] == 2
    assert residency.counts()["cpu_bytes"] <= residency.cpu_budget.limit


def test_a_saved_modules_adapter_takes_several_slots_room(spec, made):
    unit = unit_bytes(spec, RANK, torch.float32)
    residency = residency_of(spec, max_lora_bytes=3 * unit, max_cpu_loras=6)
    slots = [residency.acquire_slot(made[name]) for name in ("p1", "p2", "p3")]
    assert sorted(slots) == [0, 1, 2]
    # A running sequence uses p1's slot: there is no room without it, so it waits and
    # nothing is evicted.
    assert residency.acquire_slot(made["s1"], busy_slots={slots[0]}) is None
    assert len(in_slots(residency)) == 3 and residency.counts()["device_evictions"] == 0
    slot = residency.acquire_slot(made["s1"])
    assert slot is not None
    assert (
        names_in_slots(residency, made.values()) == {"s1"} and residency.slot_of(made["s1"]) == slot
    )
    stats = residency.counts()
    assert stats["device_evictions"] == 3
    saved = load_adapter(made["s1"].lora_path, spec, RANK)
    assert stats["resident_bytes"] == slot_bytes(saved, torch.float32)
    # Nothing of the evicted adapters is left in the slots they held.
    for other in set(range(3)) - {slot}:
        assert residency.slot_tensors.scales[other] == 0
        assert other not in residency.slot_tensors.vocab_extras
        for layer in range(spec.num_layers):
            for module in spec.modules:
                assert adds_nothing(slot_reads(residency, layer, module, other))
    assert set(residency.slot_tensors.vocab_extras) == {slot}
    # A plain adapter after it goes beside it only once the bytes allow: here they do not.
    assert residency.acquire_slot(made["p4"], busy_slots={slot}) is None
    assert residency.acquire_slot(made["p4"]) is not None
    assert names_in_slots(residency, made.values()) == {"p4"} and len(in_slots(residency)) == 1
    assert residency.counts()["resident_bytes"] == slot_bytes(
        load_adapter(made["p4"].lora_path, spec, RANK), torch.float32
    )
    assert residency.slot_tensors.vocab_extras == {}, "the saved matrices left with it"


@pytest.mark.parametrize("tier", ["cpu", "slots"])
def test_an_adapter_larger_than_a_whole_tier_is_refused_naming_the_sizes(spec, made, tier):
    unit = unit_bytes(spec, RANK, torch.float32)
    limit = {"max_cpu_lora_bytes" if tier == "cpu" else "max_lora_bytes": 2 * unit}
    residency = residency_of(spec, **limit, max_cpu_loras=4)
    residency.preload(made["p1"])
    before = (residency.counts(), cpu_names(residency))
    size = cpu_bytes(load_adapter(made["s1"].lora_path, spec, RANK))
    with pytest.raises(AdapterTooLargeError) as refused:
        residency.preload(made["s1"])
    message = str(refused.value)
    assert refused.value.size == size and refused.value.limit == 2 * unit
    assert str(size) in message and str(2 * unit) in message
    assert ("CPU tier" if tier == "cpu" else "device slots") in message
    assert ("max_cpu_lora_bytes" if tier == "cpu" else "max_lora_bytes") in message
    assert refused.value.field == "size_bytes"
    with pytest.raises(AdapterTooLargeError):
        residency.acquire_slot(made["s1"])
    stats, names = before
    after = residency.counts()
    assert names == cpu_names(residency) == ["p1"], "nothing stored, nothing evicted"
    for key in ("cpu_evictions", "device_evictions", "disk_loads", "cpu_bytes"):
        assert after[key] == stats[key], key


def test_budgets_are_checked(spec):
    with pytest.raises(ValueError, match="max_lora_bytes"):
        residency_of(spec, max_lora_bytes=0)
    with pytest.raises(ValueError, match="max_cpu_lora_bytes"):
        residency_of(spec, max_cpu_lora_bytes=1.5)
