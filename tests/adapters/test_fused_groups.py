"""Fused module groups: each module of q/k/v (or gate/up) adds its adapter to its own columns."""

from __future__ import annotations

import pytest
import torch

from loragate import kernels
from loragate.adapters import LoRAModelSpec, LoRARequest, load_adapter
from loragate.engine.lora.adapter_residency import AdapterResidency


def per_module_reference(adapters, slots, layer, members, spec, x):
    """float64: each token's adapter applied module by module, outputs side by side."""
    columns = []
    for module in members:
        d_out = spec.modules[module][1]
        out = torch.zeros(x.shape[0], d_out, dtype=torch.float64)
        for row, slot in enumerate(slots.tolist()):
            adapter = adapters.get(slot)
            if adapter is None or (layer, module) not in adapter.weights:
                continue
            a, b = adapter.weights[(layer, module)]
            out[row] = adapter.scale * (x[row].double() @ a.double().T) @ b.double().T
        columns.append(out)
    return torch.cat(columns, dim=1)


def test_module_weights_apply_every_module_to_its_own_columns(spec, make_adapter):
    """The stacks' views (what a GPU's slots hold: copied in)."""
    residency, adapters = _three_adapters(spec, make_adapter, borrow=False)
    slots = torch.tensor([0, 0, 1, 2, 2, 1, -1, 0, -1])
    index = kernels.lora_index(slots, 3)
    rank = residency.effective_rank
    for layer in range(spec.num_layers):
        for group, members in residency.slot_tensors.groups.items():
            d_in = spec.modules[members[0]][0]
            views = residency.slot_tensors.module_weights(layer, group, rank)
            assert [a.shape for a, _, _ in views] == [(3, rank, d_in)] * len(members)
            width = sum(spec.modules[module][1] for module in members)
            assert views[-1][2].stop == width
            x = torch.randn(slots.shape[0], d_in)
            out = torch.zeros(slots.shape[0], width)
            for a, b, columns in views:
                kernels.lora_apply(
                    x, a, b, slots, residency.slot_tensors.scales, out[:, columns], index=index
                )
            expected = per_module_reference(adapters, slots, layer, members, spec, x)
            assert torch.allclose(out.double(), expected, atol=1e-5), (layer, group)


@pytest.mark.parametrize("tokens", [9, 600], ids=["decode", "prefill"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_borrowed_slots_apply_every_module_to_its_own_columns(spec, make_adapter, tokens, dtype):
    """On the CPU the slots read the CPU tier's stacks in place: nothing is copied into the
    slot stacks, and a group's one call (native kernels at decode sizes, one matmul per slot
    and module past them) adds what the adapters' own weights give."""
    residency, adapters = _three_adapters(spec, make_adapter, borrow=True, dtype=dtype)
    for module in spec.modules:
        assert not residency.slot_tensors.module_a(0, module).any(), (
            "a borrowed slot copies nothing in"
        )
    pattern = torch.tensor([0, 0, 1, 2, 2, 1, -1, 0, -1])
    slots = pattern.repeat((tokens + 8) // 9)[:tokens]
    index = kernels.lora_index(slots, 3)
    rank = residency.effective_rank
    for layer in range(spec.num_layers):
        for group, members in residency.slot_tensors.groups.items():
            d_in = spec.modules[members[0]][0]
            width = sum(spec.modules[module][1] for module in members)
            x = torch.randn(slots.shape[0], d_in).to(dtype)
            out = torch.zeros(slots.shape[0], width, dtype=dtype)
            prepared = residency.slot_tensors.module_group(layer, group, rank)
            assert prepared.placed, "the group reads borrowed rows"
            kernels.lora_apply_modules(
                x, prepared, slots, residency.slot_tensors.scales, out, index=index
            )
            expected = per_module_reference(adapters, slots, layer, members, spec, x)
            tolerance = 1e-5 if dtype == torch.float32 else 5e-2
            assert torch.allclose(out.double(), expected, atol=tolerance, rtol=tolerance), (
                layer,
                group,
            )


@pytest.mark.parametrize("groups_first", [True, False], ids=["groups first", "groups after"])
def test_borrowing_slots_read_the_rows_their_loader_checked(spec, make_adapter, groups_first):
    """The rows a borrowing slot reads in each group are the ones DeviceSlots.prepare
    checked when its adapter was loaded (the step that puts it in a slot only points the
    groups at them), whether the groups were made before (as the engine makes them at
    start) or after. A group with a module whose stack cannot be borrowed (a rank_pattern
    breaks it: copied into the slot) is worked out when written. Each token gets its
    adapter's output either way."""
    residency = AdapterResidency(spec, max_loras=2, max_lora_rank=16, max_cpu_loras=2, borrow=True)
    rank = residency.effective_rank
    groups = [
        (layer, group)
        for layer in range(spec.num_layers)
        for group in residency.slot_tensors.groups
    ]
    if groups_first:
        for layer, group in groups:
            residency.slot_tensors.module_group(layer, group, rank)
    requests = [
        LoRARequest("all", 1, str(make_adapter("all", rank=8, targets=list(spec.modules)))),
        LoRARequest(
            "copied_q",
            2,
            str(
                make_adapter(
                    "copied_q",
                    rank=4,
                    seed=1,
                    targets=list(spec.modules),
                    rank_pattern={"model.layers.1.self_attn.q_proj": 2},
                )
            ),
        ),
    ]
    adapters = {}
    for request in requests:
        slot = residency.acquire_slot(request, set())
        adapters[slot] = residency.preload(request)  # the CPU tier's entry, which the slot reads
    for slot, adapter in adapters.items():
        checked = adapter.slot_rows
        copied = {"qkv_proj"} if adapter.rank == 4 else set()
        assert set(checked) == {(layer, group) for layer, group in groups if group not in copied}
        for layer, group in groups:
            read = residency.slot_tensors.module_group(layer, group, rank).rows_of(slot)
            if (layer, group) in checked:
                assert read is checked[(layer, group)].cut, (slot, layer, group)
            else:
                own = residency.slot_tensors.module_a(layer, "q_proj")[slot]
                assert read[0][0].data_ptr() == own.data_ptr(), "copied: the slot's own rows"
    slots = torch.tensor([0, 1, -1, 1, 0, 0, 1])
    index = kernels.lora_index(slots, 2)
    for layer, group in groups:
        members = residency.slot_tensors.groups[group]
        x = torch.randn(slots.shape[0], spec.modules[members[0]][0])
        out = torch.zeros(slots.shape[0], sum(spec.modules[m][1] for m in members))
        prepared = residency.slot_tensors.module_group(layer, group, rank)
        kernels.lora_apply_modules(
            x, prepared, slots, residency.slot_tensors.scales, out, index=index
        )
        expected = per_module_reference(adapters, slots, layer, members, spec, x)
        assert torch.allclose(out.double(), expected, atol=1e-5), (layer, group)


def _three_adapters(spec, make_adapter, borrow, dtype=torch.float32):
    made = {
        "qv": dict(rank=4, targets=["q_proj", "v_proj", "up_proj"]),
        "all": dict(rank=8, targets=list(spec.modules)),
        "k_gate": dict(rank=6, targets=["k_proj", "gate_proj"], use_rslora=True),
    }
    requests = [
        LoRARequest(name, i + 1, str(make_adapter(name, seed=i, **kw)))
        for i, (name, kw) in enumerate(made.items())
    ]
    residency = AdapterResidency(
        spec, max_loras=3, max_lora_rank=16, max_cpu_loras=3, borrow=borrow, dtype=dtype
    )
    adapters = {}
    for request in requests:
        slot = residency.acquire_slot(request, set())
        adapters[slot] = load_adapter(request.lora_path, spec, 16)
    assert residency.slot_tensors.groups["qkv_proj"] == ("q_proj", "k_proj", "v_proj")
    assert residency.slot_tensors.groups["gate_up_proj"] == ("gate_proj", "up_proj")
    assert residency.slot_tensors.groups["o_proj"] == ("o_proj",)
    return residency, adapters


def test_module_weights_are_views_of_the_slot_stacks(spec, make_adapter):
    residency = AdapterResidency(spec, max_loras=2, max_lora_rank=8, max_cpu_loras=2, borrow=False)
    views = residency.slot_tensors.module_weights(0, "qkv_proj", 4)
    residency.acquire_slot(
        LoRARequest("x", 1, str(make_adapter("x", rank=4, targets=["k_proj"]))), set()
    )
    (q_a, q_b, q_cols), (k_a, k_b, k_cols), (v_a, v_b, _) = views
    q_out, k_out = spec.modules["q_proj"][1], spec.modules["k_proj"][1]
    assert q_cols == slice(0, q_out) and k_cols == slice(q_out, q_out + k_out)
    # The views made before the load see it: the storage never moved.
    assert k_a[0].any() and k_b[0].any()
    assert not (q_a.any() or q_b.any() or v_a.any() or v_b.any()), "only k's weights were given"
    assert not k_a[1].any(), "slot 1 is empty"
    assert residency.slot_tensors.module_weights(0, "qkv_proj", 4) is views, "views are made once"


@pytest.mark.parametrize(
    "fused, message",
    [
        ({"qk": ("q_proj", "nope_proj")}, "unknown modules"),
        ({"qd": ("q_proj", "down_proj")}, "different d_in"),
        ({"a": ("q_proj",), "b": ("q_proj", "k_proj")}, "repeats a module"),
        ({"o_proj": ("q_proj", "k_proj")}, "also a module name"),
        ({"empty": ()}, "unknown modules"),
    ],
)
def test_spec_refuses_bad_fused_groups(spec, fused, message):
    with pytest.raises(ValueError, match=message):
        LoRAModelSpec(model_name="m", num_layers=1, modules=spec.modules, fused=fused)
