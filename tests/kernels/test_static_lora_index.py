"""The static LoRA index CUDA graphs replay with: every slot visited, no host read.

Checked with the Triton kernels (the interpreter here, compiled on a GPU machine) against the
float64 reference, on batches laid out as the engine pads a graph's batch: grouped by slot,
base-model rows and padding last, some slots empty.
"""

import pytest
import torch
from kernel_reference import lora_expand_reference, lora_shrink_reference, rel_error
from test_lora import padded_stack

from loragate import kernels

RANKS = [8, 16, 4, 8, 16, 8]


def group_ends(slots: torch.Tensor, num_slots: int) -> torch.Tensor:
    active = slots[slots >= 0]
    counts = torch.bincount(active, minlength=num_slots)
    return torch.cumsum(counts, 0).to(torch.int32)


LAYOUTS = {
    "slots, then base, then padding": [0, 0, 2, 2, 2, 5, -1, -1, -1, -1],
    "one slot": [3] * 7,
    "base only": [-1] * 9,
    "every slot": [0, 1, 2, 3, 4, 5, 5, 5],
    "gaps and padding": [1, 1, 4, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1],
}


@pytest.mark.parametrize("backend", ["triton"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_static_index_matches_reference(backend, layout):
    lora_a, lora_b = padded_stack(RANKS, 16, 48, 40)
    slots = torch.tensor(LAYOUTS[layout])
    index = kernels.static_lora_index(slots, group_ends(slots, len(RANKS)), len(RANKS))
    x, scales = torch.randn(slots.shape[0], 48), torch.rand(len(RANKS)) + 0.5
    out = torch.randn(slots.shape[0], 40)
    before = out.clone()
    y = kernels.lora_shrink(x, lora_a, slots, backend=backend, index=index)
    assert rel_error(y, lora_shrink_reference(x, lora_a, slots)) < 1e-4
    kernels.lora_apply(x, lora_a, lora_b, slots, scales, out, backend=backend, index=index)
    expected = lora_expand_reference(y, lora_b, slots, scales, before)
    assert rel_error(out, expected) < 1e-4
    assert torch.equal(out[slots < 0], before[slots < 0])


@pytest.mark.parametrize("backend", ["triton"])
def test_static_index_rewritten_in_place_serves_the_new_batch(backend):
    """What a graph replay relies on: the same index objects, new contents written in."""
    lora_a, lora_b = padded_stack(RANKS, 16, 48, 40)
    scales = torch.rand(len(RANKS)) + 0.5
    slots = torch.tensor(LAYOUTS["slots, then base, then padding"])
    ends = group_ends(slots, len(RANKS))
    index = kernels.static_lora_index(slots, ends, len(RANKS))
    for layout in ("every slot", "one slot"):
        new = torch.tensor(LAYOUTS[layout] + [-1] * (slots.shape[0] - len(LAYOUTS[layout])))
        slots.copy_(new)
        ends.copy_(group_ends(new, len(RANKS)))
        x, out = torch.randn(slots.shape[0], 48), torch.randn(slots.shape[0], 40)
        before = out.clone()
        kernels.lora_apply(x, lora_a, lora_b, slots, scales, out, backend=backend, index=index)
        y = lora_shrink_reference(x, lora_a, new)
        assert rel_error(out, lora_expand_reference(y, lora_b, new, scales, before)) < 1e-4


def test_torch_backend_refuses_a_static_index():
    lora_a, lora_b = padded_stack(RANKS, 16, 48, 40)
    slots = torch.tensor([0, 1, -1])
    index = kernels.static_lora_index(slots, group_ends(slots, len(RANKS)), len(RANKS))
    x, out = torch.randn(3, 48), torch.zeros(3, 40)
    with pytest.raises(ValueError, match="static LoRA index"):
        kernels.lora_apply(x, lora_a, lora_b, slots, torch.ones(6), out, "torch", index=index)


def test_static_index_checks_group_ends():
    with pytest.raises(ValueError, match="group_ends must be int32"):
        kernels.static_lora_index(torch.tensor([0, 1]), torch.tensor([1, 2]), 2)
