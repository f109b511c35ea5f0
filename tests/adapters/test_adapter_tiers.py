"""The adapter tiers under their owner, the residency: slot contents, LRU, busy slots,
in-place copies, CPU tier, failures."""

from __future__ import annotations

import copy
import ctypes
import json
import os
import threading

import pytest
import torch
from peft import PeftModel
from tiers_testlib import names_in_slots
from tiny_llama import ALL_MODULES, HF_INIT_NAME, hf_init_tiny_model, tiny_config

from loragate.adapters import (
    AdapterError,
    LoRARequest,
    load_adapter,
)
from loragate.engine.lora.adapter_residency import AdapterResidency
from loragate.engine.models.llama import lora_spec
from loragate.tools import make_random_adapter

ALL = list(ALL_MODULES)


@pytest.fixture
def adapters(make_adapter):
    """Five adapters of different ranks and targets, as requests."""
    made = {
        "a": dict(rank=4, targets=["q_proj", "v_proj"]),
        "b": dict(rank=8, targets=ALL),
        "c": dict(rank=2, targets=["down_proj"]),
        "d": dict(rank=6, targets=["k_proj", "o_proj", "up_proj"], use_rslora=True),
        "e": dict(rank=8, targets=["gate_proj"]),
    }
    return {
        name: LoRARequest(name, i + 1, str(make_adapter(name, seed=i, **kw)))
        for i, (name, kw) in enumerate(made.items())
    }


@pytest.fixture(params=[True, False], ids=["borrowed", "copied"])
def borrow(request):
    """On the CPU a slot reads the CPU tier's rows in place (borrowed) unless told to copy
    them, as a GPU's slots do: the tests of what a slot holds run both ways."""
    return request.param


def make_residency(spec, **kwargs) -> AdapterResidency:
    kwargs.setdefault("max_loras", 2)
    kwargs.setdefault("max_lora_rank", 8)
    kwargs.setdefault("max_cpu_loras", 4)
    return AdapterResidency(spec, **kwargs)


def slot_reads(residency, layer, module, slot):
    """What ``slot`` reads for one module of one layer, as the LoRA kernels read it (its
    group's prepared rows at max_lora_rank: its own rows, or the CPU tier's it borrows):
    A ``[r, d_in]`` and B ``[d_out, r]``, or None where it adds nothing."""
    slots = residency.slot_tensors
    group = next(g for g, members in slots.groups.items() if module in members)
    read = slots.module_group(layer, group, residency.max_lora_rank).rows_of(slot)
    rows = read[slots.groups[group].index(module)]
    return None if rows is None else (rows[0], rows[1].T)


def adds_nothing(rows) -> bool:
    return rows is None or not (rows[0].any() or rows[1].any())


def assert_slot_holds(residency, slot, request, spec):
    """What the slot reads (its own rows or the CPU tier's it borrows) is the adapter."""
    adapter = load_adapter(request.lora_path, spec, residency.max_lora_rank)
    assert residency.slot_tensors.scales[slot].item() == pytest.approx(adapter.scale)
    for layer in range(spec.num_layers):
        for module in spec.modules:
            rows = slot_reads(residency, layer, module, slot)
            if (layer, module) not in adapter.weights:
                assert adds_nothing(rows), f"{module} not targeted but non-zero"
                continue
            a, b = rows
            ref_a, ref_b = adapter.weights[(layer, module)]
            r = ref_a.shape[0]
            assert torch.equal(a[:r], ref_a) and torch.equal(b[:, :r], ref_b)
            assert not a[r:].any() and not b[:, r:].any(), "rank padding must be zero"


def test_slots_are_allocated_once_as_zeros(spec):
    residency = make_residency(spec, max_loras=3, max_lora_rank=8)
    for layer in range(spec.num_layers):
        for module, (d_in, d_out) in spec.modules.items():
            assert residency.slot_tensors.module_a(layer, module).shape == (3, 8, d_in)
            assert residency.slot_tensors.module_b(layer, module).shape == (3, d_out, 8)
            assert not residency.slot_tensors.module_a(layer, module).any()
    assert residency.slot_tensors.scales.shape == (3,) and not residency.slot_tensors.scales.any()
    assert residency.effective_rank == 0
    assert residency.counts()["resident_adapters"] == 0


def test_acquire_copies_weights_into_a_free_slot(spec, adapters, borrow):
    residency = make_residency(spec, borrow=borrow)
    assert residency.acquire_slot(adapters["a"], set()) == 0
    assert residency.acquire_slot(adapters["d"], set()) == 1
    assert_slot_holds(residency, 0, adapters["a"], spec)
    assert_slot_holds(residency, 1, adapters["d"], spec)
    assert residency.slot_of(adapters["a"]) == 0 and residency.slot_of(adapters["b"]) is None
    assert residency.effective_rank == 6
    stats = residency.counts()
    assert stats["slot_loads"] == 2 and stats["disk_loads"] == 2 and stats["device_hits"] == 0
    assert stats["resident_adapters"] == 2 and stats["load_seconds"] > 0


def test_slot_reproduces_the_peft_layer(base_model, spec, adapters, borrow):
    """base(x) + scale * (x @ A[slot]^T) @ B[slot]^T is PEFT's output for every targeted layer."""
    residency = make_residency(spec, borrow=borrow)
    request = adapters["d"]
    slot = residency.acquire_slot(request, set())
    peft_model = PeftModel.from_pretrained(copy.deepcopy(base_model), request.lora_path)
    x = torch.randn(5, 128, generator=torch.Generator().manual_seed(0))
    checked = 0
    for name, module in peft_model.named_modules():
        if not (hasattr(module, "lora_A") and "default" in module.lora_A):
            continue
        layer, proj = int(name.split(".")[-3]), name.split(".")[-1]
        d_in = spec.modules[proj][0]
        xs = x[:, :d_in]
        a, b = slot_reads(residency, layer, proj, slot)
        ours = module.base_layer(xs) + residency.slot_tensors.scales[slot] * (xs @ a.T) @ b.T
        torch.testing.assert_close(ours, module(xs), rtol=1e-5, atol=1e-6)
        checked += 1
    assert checked == 2 * 3


def test_hits_and_least_recently_used_eviction(spec, adapters, borrow):
    residency = make_residency(spec, borrow=borrow)
    a, b, c = adapters["a"], adapters["b"], adapters["c"]
    assert residency.acquire_slot(a, set()) == 0
    assert residency.acquire_slot(b, set()) == 1
    assert residency.acquire_slot(a, set()) == 0  # hit: b is now least recently used
    assert residency.acquire_slot(c, set()) == 1
    assert names_in_slots(residency, [a, b, c]) == {"a", "c"}
    assert_slot_holds(residency, 1, c, spec)
    stats = residency.counts()
    assert stats["device_hits"] == 1 and stats["slot_loads"] == 3
    assert stats["device_evictions"] == 1 and stats["cpu_hits"] == 0
    assert residency.acquire_slot(b, set()) == 0  # a is now the oldest; b comes back from CPU
    assert residency.counts()["cpu_hits"] == 1 and residency.counts()["disk_loads"] == 3


def test_busy_slots_are_never_evicted(spec, adapters, borrow):
    residency = make_residency(spec, borrow=borrow)
    residency.acquire_slot(adapters["a"], set())
    residency.acquire_slot(adapters["b"], set())
    # a (slot 0) is least recently used but busy: b's slot goes instead.
    assert residency.acquire_slot(adapters["c"], {0}) == 1
    assert names_in_slots(residency, adapters.values()) == {"a", "c"}
    assert residency.acquire_slot(adapters["d"], {0, 1}) is None
    assert names_in_slots(residency, adapters.values()) == {"a", "c"}
    assert_slot_holds(residency, 0, adapters["a"], spec)
    assert_slot_holds(residency, 1, adapters["c"], spec)
    stats = residency.counts()
    assert stats["acquire_waits"] == 1 and stats["device_evictions"] == 1
    # A resident adapter is still a hit while every slot is busy.
    assert residency.acquire_slot(adapters["a"], {0, 1}) == 0


def test_loads_copy_in_place_never_reallocate(spec, adapters):
    residency = make_residency(spec, max_loras=2)
    pointers = {
        (layer, module): (
            residency.slot_tensors.module_a(layer, module).data_ptr(),
            residency.slot_tensors.module_b(layer, module).data_ptr(),
        )
        for layer in range(spec.num_layers)
        for module in spec.modules
    }
    scales_ptr = residency.slot_tensors.scales.data_ptr()
    for name in "abcdeab":
        residency.acquire_slot(adapters[name], set())
    residency.remove(adapters["a"])
    assert residency.counts()["device_evictions"] == 5
    assert residency.slot_tensors.scales.data_ptr() == scales_ptr
    for (layer, module), (a_ptr, b_ptr) in pointers.items():
        assert residency.slot_tensors.module_a(layer, module).data_ptr() == a_ptr
        assert residency.slot_tensors.module_b(layer, module).data_ptr() == b_ptr


def test_smaller_rank_replacing_larger_leaves_zero_padding(spec, adapters, borrow):
    residency = make_residency(spec, max_loras=1, max_lora_rank=8, borrow=borrow)
    residency.acquire_slot(adapters["b"], set())  # rank 8 on every module
    assert residency.effective_rank == 8
    assert residency.acquire_slot(adapters["c"], set()) == 0  # rank 2 on down_proj only
    assert_slot_holds(residency, 0, adapters["c"], spec)
    assert not slot_reads(residency, 1, "down_proj", 0)[0][2:].any()
    assert adds_nothing(slot_reads(residency, 0, "q_proj", 0))
    assert residency.effective_rank == 2


def test_same_name_other_path_is_another_adapter_same_files_are_one(spec, make_adapter):
    """The tiers are keyed by the files' content: another path with other weights is another
    entry; another int id for the same files shares the entry (no second disk load)."""
    old = LoRARequest("sql", 1, str(make_adapter("v1", rank=4, targets=ALL, seed=1)))
    new_path = LoRARequest("sql", 1, str(make_adapter("v2", rank=4, targets=ALL, seed=2)))
    new_id = LoRARequest("sql", 2, old.lora_path)
    residency = make_residency(spec, max_loras=1)
    residency.acquire_slot(old, set())
    assert residency.acquire_slot(new_path, set()) == 0
    assert_slot_holds(residency, 0, new_path, spec)
    assert residency.slot_of(old) is None and residency.counts()["disk_loads"] == 2
    assert residency.acquire_slot(new_id, set()) == 0
    assert residency.counts()["disk_loads"] == 2 and residency.counts()["cpu_hits"] == 1
    assert_slot_holds(residency, 0, new_id, spec)


def test_cpu_tier_holds_at_most_max_cpu_loras(spec, adapters):
    residency = make_residency(spec, max_loras=1, max_cpu_loras=2)
    a, b, c = adapters["a"], adapters["b"], adapters["c"]
    for request in (a, b, c):
        assert residency.preload(request).path.name == request.lora_name
    assert residency.cpu_resident() == [b, c]
    stats = residency.counts()
    assert stats["cpu_evictions"] == 1 and stats["disk_loads"] == 3 and stats["cpu_adapters"] == 2
    residency.preload(b)  # hit: c is now the least recently used
    assert residency.counts()["cpu_hits"] == 1
    residency.preload(a)
    assert residency.cpu_resident() == [b, a] and residency.counts()["disk_loads"] == 4
    assert residency.counts()["resident_adapters"] == 0  # preloading never fills device slots


def test_acquire_reads_through_the_cpu_tier(spec, adapters):
    residency = make_residency(spec)
    adapter = residency.preload(adapters["a"])
    assert adapter.rank == 4
    residency.acquire_slot(adapters["a"], set())
    stats = residency.counts()
    assert stats["disk_loads"] == 1 and stats["cpu_hits"] == 1 and stats["slot_loads"] == 1


def _corrupt(make_adapter):
    path = make_adapter("broken")
    (path / "adapter_config.json").write_text("{")
    return LoRARequest("broken", 99, str(path))


def test_preload_failure_leaves_the_cache_unchanged(spec, adapters, make_adapter):
    residency = make_residency(spec, max_loras=1, max_cpu_loras=2)
    residency.preload(adapters["a"])
    residency.acquire_slot(adapters["b"], set())
    before = (residency.counts(), residency.cpu_resident(), residency.tiers())
    with pytest.raises(AdapterError, match="invalid JSON"):
        residency.preload(_corrupt(make_adapter))
    assert (residency.counts(), residency.cpu_resident(), residency.tiers()) == before


def test_acquire_failure_leaves_slots_unchanged(spec, adapters, make_adapter):
    residency = make_residency(spec, max_loras=1)
    residency.acquire_slot(adapters["a"], set())
    before = residency.counts()
    with pytest.raises(AdapterError):
        residency.acquire_slot(_corrupt(make_adapter), set())
    assert residency.counts() == before and names_in_slots(residency, adapters.values()) == {"a"}
    assert_slot_holds(residency, 0, adapters["a"], spec)


def test_remove_clears_every_tier(spec, adapters, borrow):
    residency = make_residency(spec, borrow=borrow)
    residency.acquire_slot(adapters["b"], set())
    residency.acquire_slot(adapters["c"], set())
    with pytest.raises(ValueError, match="slot 0"):
        residency.remove(adapters["b"], busy_slots={0})
    assert residency.slot_of(adapters["b"]) == 0
    assert residency.remove(adapters["b"]) is True
    assert (
        residency.slot_of(adapters["b"]) is None and adapters["b"] not in residency.cpu_resident()
    )
    assert residency.slot_tensors.scales[0] == 0
    assert all(adds_nothing(slot_reads(residency, layer, m, 0)) for layer in range(2) for m in ALL)
    assert all(
        not residency.slot_tensors.module_a(layer, m)[0].any() for layer in range(2) for m in ALL
    )
    assert residency.effective_rank == 2
    assert residency.remove(adapters["b"]) is False
    assert residency.acquire_slot(adapters["d"], set()) == 0  # the freed slot is reused
    assert residency.counts()["device_evictions"] == 0


def test_choose_victim_gets_plain_data(spec, adapters):
    seen = []

    def most_recently_used(candidates, tier):
        seen.append((tier, json.loads(json.dumps(candidates))))
        return max(candidates, key=lambda c: c["last_used"])["name"]

    residency = make_residency(spec, max_cpu_loras=2, choose_victim=most_recently_used)
    residency.acquire_slot(adapters["a"], set())
    residency.acquire_slot(adapters["b"], set())
    residency.acquire_slot(
        adapters["c"], set()
    )  # device: evicts b (most recent); cpu: evicts b too
    assert names_in_slots(residency, adapters.values()) == {"a", "c"}
    tiers = [tier for tier, _ in seen]
    assert tiers == ["device", "cpu"]
    device_candidates = seen[0][1]
    assert {c["name"] for c in device_candidates} == {"a", "b"}
    first = next(c for c in device_candidates if c["name"] == "a")
    sha = load_adapter(adapters["a"].lora_path, spec, 8).sha256
    assert first["key"][:3] == ["a", 1, adapters["a"].lora_path] and sha in first["key"][3]
    assert first["sha256"] == sha
    assert first["tenant"] is None and first["pinned"] is False and first["slot"] == 0
    assert first["uses"] == 1 and first["size_bytes"] > 0
    assert isinstance(first["last_used"], int)
    assert residency.cpu_resident() == [adapters["a"], adapters["c"]]


def test_choose_victim_bad_answer_is_a_clear_error(spec, adapters):
    residency = make_residency(spec, max_loras=1, choose_victim=lambda candidates, tier: "nobody")
    residency.acquire_slot(adapters["a"], set())
    with pytest.raises(ValueError, match="not a candidate for the device tier"):
        residency.acquire_slot(adapters["b"], set())
    assert names_in_slots(residency, adapters.values()) == {"a"}


def test_choose_victim_ambiguous_name(spec, make_adapter):
    twins = [LoRARequest("twin", i, str(make_adapter(f"t{i}", seed=i))) for i in (1, 2)]
    residency = make_residency(spec, max_loras=2, choose_victim=lambda candidates, tier: "twin")
    for request in twins:
        residency.acquire_slot(request, set())
    other = LoRARequest("other", 3, str(make_adapter("o")))
    with pytest.raises(ValueError, match="share"):
        residency.acquire_slot(other, set())


def test_half_precision_slots(spec, adapters, borrow):
    residency = make_residency(spec, dtype=torch.bfloat16, borrow=borrow)
    slot = residency.acquire_slot(adapters["b"], set())
    adapter = load_adapter(adapters["b"].lora_path, spec, 8)
    a, _ = adapter.weights[(1, "o_proj")]
    assert residency.slot_tensors.module_a(1, "o_proj").dtype == torch.bfloat16
    read, _ = slot_reads(residency, 1, "o_proj", slot)
    assert read.dtype == torch.bfloat16 and torch.equal(read, a.to(torch.bfloat16))


def test_concurrent_preloads_respect_the_cpu_bound(spec, make_adapter):
    requests = [LoRARequest(f"p{i}", i + 1, str(make_adapter(f"p{i}", seed=i))) for i in range(6)]
    residency = make_residency(spec, max_loras=1, max_cpu_loras=3)
    threads = [threading.Thread(target=residency.preload, args=(r,)) for r in requests]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    stats = residency.counts()
    assert stats["cpu_adapters"] == 3 and stats["cpu_evictions"] == 3 and stats["disk_loads"] == 6


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(max_loras=0), "max_loras"),
        (dict(max_lora_rank=0), "max_lora_rank"),
        (dict(max_cpu_loras=True), "max_cpu_loras"),
        (dict(max_loras=4, max_cpu_loras=2), "max_cpu_loras \\(2\\) must be >= max_loras \\(4\\)"),
        (dict(dtype=torch.int32), "floating point"),
    ],
)
def test_cache_arguments_are_checked(spec, kwargs, message):
    with pytest.raises(ValueError, match=message):
        make_residency(spec, **kwargs)


def test_uneven_layers_and_ranks_replace_a_full_adapter_cleanly(tmp_path):
    """Layers 0 and 2 only, with a per-layer rank: the slot holds exactly that, zeros elsewhere."""
    model = hf_init_tiny_model(num_hidden_layers=3)
    spec3 = lora_spec(model.config, "tiny3")
    full = make_random_adapter(model, tmp_path / "full", rank=8, targets=ALL, seed=1)
    sparse = make_random_adapter(
        model,
        tmp_path / "sparse",
        rank=4,
        targets=["q_proj", "down_proj"],
        seed=2,
        layers_to_transform=[0, 2],
        rank_pattern={"model.layers.2.self_attn.q_proj": 2},
    )
    residency = make_residency(spec3, max_loras=1)
    residency.acquire_slot(LoRARequest("full", 1, str(full)), set())
    sparse_request = LoRARequest("sparse", 2, str(sparse))
    assert residency.acquire_slot(sparse_request, set()) == 0
    assert_slot_holds(residency, 0, sparse_request, spec3)
    assert load_adapter(sparse, spec3, 8).weights[(2, "q_proj")][0].shape[0] == 2


def test_borrowing_slots_take_memory_only_for_rows_written(spec, adapters):
    """Where slots borrow the CPU tier's rows, their own stacks stay unwritten pages: of a
    cache's 150+ MB of slot stacks a small part is in memory, and they read zeros there;
    copying slots take all of it.

    What is counted is the stacks' own pages in memory (mincore), not the process's growth:
    memory that earlier tests freed stays resident in the allocator's heap, and a copying
    cache that reuses it takes all its stacks without growing the process."""
    wide = lora_spec(
        tiny_config(hidden_size=1024, intermediate_size=4096, num_hidden_layers=4),
        HF_INIT_NAME,
    )
    held = {}
    for borrow in (True, False):
        residency = make_residency(
            wide, max_loras=8, max_cpu_loras=8, max_lora_rank=64, borrow=borrow
        )
        stacks = [
            stack
            for layer in range(wide.num_layers)
            for m in wide.modules
            for stack in (
                residency.slot_tensors.module_a(layer, m),
                residency.slot_tensors.module_b(layer, m),
            )
        ]
        stack_bytes = sum(stack.numel() * stack.element_size() for stack in stacks)
        held[borrow] = resident_bytes(stacks)
        assert not residency.slot_tensors.module_a(3, "down_proj").any()
        del residency, stacks
    assert stack_bytes > 150e6
    assert held[False] > 0.9 * stack_bytes, held
    assert held[True] < 0.1 * stack_bytes, held


def resident_bytes(tensors) -> int:
    """Bytes of the pages under ``tensors`` that are in memory (Linux mincore): counted per
    page, each page once, whatever else the process holds or freed before."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    page = os.sysconf("SC_PAGE_SIZE")
    pages = set()
    for tensor in tensors:
        start = tensor.data_ptr()
        span = 1 + sum(
            (size - 1) * stride for size, stride in zip(tensor.shape, tensor.stride(), strict=True)
        )
        end = start + span * tensor.element_size()
        first = start // page * page
        count = -(-(end - first) // page)
        vector = ctypes.create_string_buffer(count)
        if libc.mincore(first, count * page, vector) != 0:
            raise OSError(ctypes.get_errno(), "mincore")
        pages.update(first + i * page for i, b in enumerate(vector.raw) if b & 1)
    return len(pages) * page
