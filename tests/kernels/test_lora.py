"""Batched LoRA shrink/expand against a float64 per-token reference.

One weight stack holds adapters of ranks 1, 8, 16 and 64, zero-padded to the stack's rank, as
the engine's device slots do; tokens are spread over every slot and over none (-1).
"""

import pytest
import torch
from kernel_reference import BACKENDS, lora_expand_reference, lora_shrink_reference, rel_error

from loragate import kernels

RANKS = [1, 8, 16, 64, 8]
D_IN, D_OUT = 72, 40


def padded_stack(ranks, max_rank, d_in, d_out):
    """lora_a [S, max_rank, d_in] and lora_b [S, d_out, max_rank], zero past each rank."""
    lora_a = torch.zeros(len(ranks), max_rank, d_in)
    lora_b = torch.zeros(len(ranks), d_out, max_rank)
    for slot, rank in enumerate(ranks):
        lora_a[slot, :rank] = torch.randn(rank, d_in)
        lora_b[slot, :, :rank] = torch.randn(d_out, rank)
    return lora_a, lora_b


def slot_pattern(name: str, num_slots: int) -> torch.Tensor:
    if name == "mixed":  # every slot at least three times, and some tokens with no adapter
        slots = torch.cat([torch.arange(num_slots).repeat(3), torch.full((5,), -1)])
        extra = torch.randint(-1, num_slots, (17,))
        return torch.cat([slots, extra])[torch.randperm(num_slots * 3 + 22)]
    if name == "none":
        return torch.full((19,), -1)
    if name == "single":
        return torch.full((21,), 3)
    if name == "single_and_none":
        return torch.tensor([2, -1, 2, 2, -1, 2, -1] * 3)
    if name == "sorted":  # already grouped by slot: the identity fast path
        return torch.arange(num_slots).repeat_interleave(torch.tensor([4, 1, 7, 18, 3]))
    if name == "sorted_then_base":  # as the engine orders a batch: base-model rows last
        return torch.cat([slot_pattern("sorted", num_slots), torch.full((6,), -1)])
    if name == "single_then_base":
        return torch.tensor([1] * 9 + [-1] * 4)
    raise AssertionError(name)


PATTERNS = [
    "mixed",
    "none",
    "single",
    "single_and_none",
    "sorted",
    "sorted_then_base",
    "single_then_base",
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("use_index", [False, True])
def test_shrink_and_expand_match_reference(backend, pattern, use_index):
    lora_a, lora_b = padded_stack(RANKS, 64, D_IN, D_OUT)
    slots = slot_pattern(pattern, len(RANKS))
    tokens = slots.shape[0]
    x = torch.randn(tokens, D_IN)
    scales = torch.rand(len(RANKS)) + 0.5
    index = kernels.lora_index(slots, len(RANKS)) if use_index else None

    y = kernels.lora_shrink(x, lora_a, slots, backend=backend, index=index)
    assert y.shape == (tokens, 64)
    expected_y = lora_shrink_reference(x, lora_a, slots)
    assert rel_error(y, expected_y) < 1e-4 if (slots >= 0).any() else torch.equal(y, 0 * y)
    assert torch.equal(y[slots < 0], torch.zeros_like(y[slots < 0]))

    # out is a column slice of a wider fused output; everything outside it must stay put.
    wide = torch.randn(tokens, D_OUT + 50)
    before = wide.clone()
    out = wide[:, 30 : 30 + D_OUT]
    kernels.lora_expand(y, lora_b, slots, scales, out, backend=backend, index=index)
    expected = lora_expand_reference(y, lora_b, slots, scales, before[:, 30 : 30 + D_OUT])
    assert rel_error(out, expected) < 1e-4
    assert torch.equal(wide[slots < 0], before[slots < 0])
    assert torch.equal(wide[:, :30], before[:, :30])
    assert torch.equal(wide[:, 30 + D_OUT :], before[:, 30 + D_OUT :])


@pytest.mark.parametrize("backend", BACKENDS)
def test_rank_window_views_match_full_stack(backend):
    """The engine passes lora_a[:, :r_eff] / lora_b[:, :, :r_eff] to skip zero padding."""
    ranks = [1, 16, 8, 16]
    lora_a, lora_b = padded_stack(ranks, 64, D_IN, D_OUT)
    slots = slot_pattern("mixed", len(ranks))
    x, scales = torch.randn(slots.shape[0], D_IN), torch.rand(len(ranks)) + 0.5
    window_a, window_b = lora_a[:, :16], lora_b[:, :, :16]
    assert not window_a.is_contiguous() and not window_b.is_contiguous()
    y = kernels.lora_shrink(x, window_a, slots, backend=backend)
    assert rel_error(y, lora_shrink_reference(x, lora_a, slots)[:, :16]) < 1e-4
    out = torch.randn(slots.shape[0], D_OUT)
    before = out.clone()
    kernels.lora_expand(y, window_b, slots, scales, out, backend=backend)
    assert rel_error(out, lora_expand_reference(y, window_b, slots, scales, before)) < 1e-4


@pytest.mark.parametrize("backend", BACKENDS)
def test_many_slots_and_wide_projection(backend):
    """More slots than a tile and d_in/d_out spanning several kernel tiles."""
    ranks = [8] * 11 + [16] * 6
    lora_a, lora_b = padded_stack(ranks, 16, 200, 150)
    slots = torch.randint(-1, len(ranks), (70,))
    x, scales = torch.randn(70, 200), torch.rand(len(ranks))
    y = kernels.lora_shrink(x, lora_a, slots, backend=backend)
    assert rel_error(y, lora_shrink_reference(x, lora_a, slots)) < 1e-4
    out = torch.randn(70, 150)
    before = out.clone()
    kernels.lora_expand(y, lora_b, slots, scales, out, backend=backend)
    assert rel_error(out, lora_expand_reference(y, lora_b, slots, scales, before)) < 1e-4


def test_lora_index_groups_tokens_by_slot():
    slots = torch.tensor([2, -1, 0, 2, 2, -1, 0])
    index = kernels.lora_index(slots, 4)
    assert index.order.tolist() == [2, 6, 0, 3, 4, 1, 5]
    assert index.group_ends.tolist() == [2, 2, 5, 5]
    assert (index.num_active, index.first_slot, index.last_slot) == (5, 0, 2)
    assert not index.is_identity and index.single_slot is None
    assert not index.is_sorted
    sorted_index = kernels.lora_index(torch.tensor([1, 1, 3]), 4)
    assert sorted_index.is_identity and sorted_index.is_sorted
    base_last = kernels.lora_index(torch.tensor([0, 2, 2, -1, -1]), 4)
    assert base_last.is_sorted and not base_last.is_identity
    assert not kernels.lora_index(torch.tensor([0, -1, 2]), 4).is_sorted
    assert kernels.lora_index(torch.tensor([3, -1, 3]), 4).single_slot == 3
    empty = kernels.lora_index(torch.tensor([-1, -1]), 4)
    assert (empty.num_active, empty.first_slot, empty.single_slot) == (0, -1, None)


def test_lora_rejects_bad_inputs():
    lora_a, lora_b = padded_stack([4, 4], 4, 8, 6)
    x = torch.randn(3, 8)
    with pytest.raises(ValueError, match="slot id"):
        kernels.lora_shrink(x, lora_a, torch.tensor([0, 2, -1]))
    with pytest.raises(ValueError, match="d_in"):
        kernels.lora_shrink(torch.randn(3, 9), lora_a, torch.tensor([0, 1, -1]))
    with pytest.raises(ValueError, match="slot_ids must be"):
        kernels.lora_shrink(x, lora_a, torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="index was built for"):
        kernels.lora_shrink(
            x, lora_a, torch.tensor([0, 1, -1]), index=kernels.lora_index(torch.tensor([0]), 2)
        )
    with pytest.raises(ValueError, match="integer"):
        kernels.lora_index(torch.tensor([0.0, 1.0]), 2)
    with pytest.raises(ValueError, match="out must be"):
        kernels.lora_expand(
            torch.randn(3, 4), lora_b, torch.tensor([0, 1, -1]), torch.ones(2), torch.zeros(3, 7)
        )
    with pytest.raises(ValueError, match="scales must be"):
        kernels.lora_expand(
            torch.randn(3, 4), lora_b, torch.tensor([0, 1, -1]), torch.ones(3), torch.zeros(3, 6)
        )
    with pytest.raises(ValueError, match="unknown kernel backend"):
        kernels.lora_shrink(x, lora_a, torch.tensor([0, 1, -1]), backend="numpy")


def test_odd_ranks_and_unaligned_views_fall_back_correctly():
    """Rank 6 in fp32 gives 24-byte strides that torch's grouped matmul refuses."""
    torch.manual_seed(0)
    x = torch.randn(5, 64)
    lora_a = torch.randn(3, 8, 64)
    lora_b = torch.randn(3, 32, 8)
    slot_ids = torch.tensor([0, 1, 2, 1, -1])
    a, b = lora_a[:, :6], lora_b[:, :, :6]
    index = kernels.lora_index(slot_ids, 3)
    y = kernels.lora_shrink(x, a, slot_ids, backend="torch", index=index)
    out = torch.zeros(5, 32)
    kernels.lora_expand(y, b, slot_ids, torch.ones(3), out, backend="torch", index=index)
    expected = torch.zeros(5, 32, dtype=torch.float64)
    for t, s in enumerate(slot_ids.tolist()):
        if s >= 0:
            expected[t] = x[t].double() @ a[s].double().T @ b[s].double().T
    torch.testing.assert_close(out.double(), expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("pattern", PATTERNS)
def test_lora_apply_is_shrink_then_expand(backend, pattern):
    lora_a, lora_b = padded_stack(RANKS, 64, D_IN, D_OUT)
    # Also the engine's layout: B stored transposed, handed out as a [S, d_out, r] view.
    lora_bt_view = lora_b.transpose(1, 2).contiguous().transpose(1, 2)
    slots = slot_pattern(pattern, len(RANKS))
    x = torch.randn(slots.shape[0], D_IN)
    scales = torch.rand(len(RANKS)) + 0.5
    expected_y = lora_shrink_reference(x, lora_a, slots)
    for b in (lora_b, lora_bt_view):
        out = torch.randn(slots.shape[0], D_OUT)
        before = out.clone()
        kernels.lora_apply(x, lora_a, b, slots, scales, out, backend=backend)
        expected = lora_expand_reference(expected_y, lora_b, slots, scales, before)
        assert rel_error(out, expected) < 1e-4


def test_lora_apply_rejects_mismatched_shapes():
    lora_a, lora_b = padded_stack([4, 4], 4, 8, 6)
    x, scales, slots = torch.randn(3, 8), torch.ones(2), torch.tensor([0, 1, -1])
    with pytest.raises(ValueError, match="does not match lora_a"):
        kernels.lora_apply(x, lora_a, lora_b[:, :, :3], slots, scales, torch.zeros(3, 6))
    with pytest.raises(ValueError, match="out must be"):
        kernels.lora_apply(x, lora_a, lora_b, slots, scales, torch.zeros(3, 5))
    with pytest.raises(ValueError, match="d_in"):
        kernels.lora_apply(torch.randn(3, 9), lora_a, lora_b, slots, scales, torch.zeros(3, 6))
    with pytest.raises(ValueError, match="slot id"):
        kernels.lora_apply(x, lora_a, lora_b, torch.tensor([0, 2, 0]), scales, torch.zeros(3, 6))
