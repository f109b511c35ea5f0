"""kernels.lora_apply_modules: every module of a projection (q/k/v, gate/up or a single one)
adds its adapters' output to its own columns of the output, in one call, against the float64
per-module reference; the native call and the per-module torch path agree."""

import pytest
import torch
from kernel_reference import rel_error

from loragate import kernels
from loragate.kernels import lora_cpu, lora_modules

D_IN = 72
D_OUTS = (48, 24, 24)  # q, k, v of a grouped-query model: k and v narrower than q
RANK = 6
SLOTS = 4


def fused_group(dtype, slots: int = SLOTS, rank: int = RANK, empty: int | None = 2):
    """Per module, A [S, r, d_in] and B [S, d_out, r] as views of the slots' layout (B
    stored transposed), slot `empty` zero (None: every slot holds weights), and its columns
    of the fused output."""
    made, start = [], 0
    for d_out in D_OUTS:
        a = torch.randn(slots, rank, D_IN, dtype=dtype)
        bt = torch.randn(slots, rank, d_out, dtype=dtype)
        if empty is not None:
            a[empty], bt[empty] = 0, 0
        made.append((a, bt.transpose(1, 2), slice(start, start + d_out)))
        start += d_out
    return made


def reference(x, modules, slots, scales, before):
    """float64: token by token, module by module."""
    out = before.double().clone()
    for a, b, columns in modules:
        for row, slot in enumerate(slots.tolist()):
            if slot >= 0:
                delta = (x[row].double() @ a[slot].double().T) @ b[slot].double().T
                out[row, columns] += scales[slot].double() * delta
    return out


@pytest.mark.parametrize("dtype, bound", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("path", ["native", "per module"])
def test_every_module_adds_to_its_own_columns(dtype, bound, path, monkeypatch):
    torch.manual_seed(7)
    modules = fused_group(dtype)
    group = kernels.LoRAModules(modules)
    if path == "native":
        assert group.table is not None, lora_cpu.native_lora_error()

        def refuse(*args, **kwargs):
            raise AssertionError("the per-module path ran where the native call serves")

        monkeypatch.setattr(lora_modules, "lora_apply", refuse)
    else:
        group.table = None  # as where the native kernels cannot take the tensors
    slots = torch.tensor([3, -1, 0, 0, 2, 1, -1, 3])
    x = torch.randn(slots.shape[0], D_IN, dtype=dtype)
    scales = torch.rand(SLOTS) + 0.5
    fused = torch.randn(slots.shape[0], sum(D_OUTS), dtype=dtype)
    before = fused.clone()
    kernels.lora_apply_modules(x, group, slots, scales, fused, index=kernels.lora_index(slots, 4))
    assert rel_error(fused, reference(x, modules, slots, scales, before)) < bound
    assert torch.equal(fused[slots < 0], before[slots < 0]), "base-only rows must not change"


def test_bad_shapes_are_named():
    modules = fused_group(torch.float32)
    with pytest.raises(ValueError, match="columns"):
        kernels.LoRAModules([(modules[0][0], modules[0][1], slice(0, 7))])
    with pytest.raises(ValueError, match="differs from the first module"):
        kernels.LoRAModules([modules[0], (modules[1][0][:, :3], modules[1][1], modules[1][2])])
    group = kernels.LoRAModules(modules)
    slots = torch.tensor([0, 1])
    with pytest.raises(ValueError, match="x must be"):
        kernels.lora_apply_modules(
            torch.randn(2, 5), group, slots, torch.ones(4), torch.zeros(2, 96)
        )
    with pytest.raises(ValueError, match="out must be"):
        kernels.lora_apply_modules(
            torch.randn(2, D_IN), group, slots, torch.ones(4), torch.zeros(2, 50)
        )


def placed_rows(dtype, rank, skip=None):
    """Per module, rows kept elsewhere than the stacks: A [rank, d_in] and B transposed
    [rank, d_out] (None for the module `skip`, which the slot leaves alone)."""
    return [
        None
        if m == skip
        else (torch.randn(rank, D_IN, dtype=dtype), torch.randn(rank, d_out, dtype=dtype))
        for m, d_out in enumerate(D_OUTS)
    ]


def as_stacks(modules, placements):
    """The stacks a group with `placements` (slot -> rows) reads as: each placed slot's rows
    zero-padded to the group's rank, zeros for a module it leaves alone."""
    read = []
    for m, (a, b, columns) in enumerate(modules):
        a, b = a.clone(), b.clone()
        for slot, rows in placements.items():
            a[slot], b[slot] = 0, 0
            if rows[m] is not None:
                r = rows[m][0].shape[0]
                a[slot, :r], b[slot, :, :r] = rows[m][0], rows[m][1].T
        read.append((a, b, columns))
    return read


@pytest.mark.parametrize("dtype, bound", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("tokens", [8, 600], ids=["native", "per slot"])
def test_placed_slots_read_their_own_rows(dtype, bound, tokens):
    """Slots placed elsewhere (the CPU tier's rows, read in place) at their own ranks, one of
    them below the group's, one leaving a module alone, beside slots read from the stacks:
    each token gets its own slot's rows, natively at decode sizes and by one matmul per slot
    and module past them. Placing a slot back reads the stacks again."""
    torch.manual_seed(11)
    modules = fused_group(dtype)
    group = kernels.LoRAModules(modules)
    placements = {1: placed_rows(dtype, 2), 3: placed_rows(dtype, RANK, skip=1)}
    for slot, rows in placements.items():
        group.place(slot, rows)
    assert set(group.placed) == {1, 3}
    slots = torch.tensor([3, -1, 0, 1, 2, 1, -1, 3]).repeat(tokens // 8)
    x = torch.randn(slots.shape[0], D_IN, dtype=dtype)
    scales = torch.rand(SLOTS) + 0.5
    before = torch.randn(slots.shape[0], sum(D_OUTS), dtype=dtype)
    for _ in range(2):
        fused = before.clone()
        index = kernels.lora_index(slots, SLOTS)
        kernels.lora_apply_modules(x, group, slots, scales, fused, index=index)
        expected = reference(x, as_stacks(modules, placements), slots, scales, before)
        assert rel_error(fused, expected) < bound
        assert torch.equal(fused[slots < 0], before[slots < 0]), "base rows must not change"
        group.place(3, None)  # back to the stacks
        placements.pop(3, None)
    assert set(group.placed) == {1}


@pytest.mark.parametrize("tokens", [8, 600], ids=["native", "per slot"])
def test_rows_checked_ahead_read_as_plain_rows(tokens):
    """Rows checked ahead of the step (kernels.slot_rows, as an adapter's loader thread
    does) and placed as they are give each token what the same rows placed plainly give:
    above the group's rank cut to it, a module left alone untouched."""
    torch.manual_seed(12)
    modules = fused_group(torch.float32)
    plain, ahead = kernels.LoRAModules(modules), kernels.LoRAModules(modules)
    rows = {1: placed_rows(torch.float32, RANK + 3), 3: placed_rows(torch.float32, 2, skip=2)}
    for slot, given in rows.items():
        plain.place(slot, given)
        checked = kernels.slot_rows(given, D_IN, D_OUTS, RANK, torch.float32, "cpu")
        assert checked.own_rank == min(RANK, given[0][0].shape[0])
        ahead.place(slot, checked)
        assert ahead.rows_of(slot) is checked.cut, "rows checked ahead are read as they are"
    slots = torch.tensor([3, -1, 0, 1, 2, 1, -1, 3]).repeat(tokens // 8)
    x = torch.randn(slots.shape[0], D_IN)
    scales = torch.rand(SLOTS) + 0.5
    before = torch.randn(slots.shape[0], sum(D_OUTS))
    outs = []
    for group in (plain, ahead):
        out = before.clone()
        kernels.lora_apply_modules(x, group, slots, scales, out, index=kernels.lora_index(slots, 4))
        outs.append(out)
    assert torch.equal(outs[0], outs[1])
    expected = reference(
        x,
        as_stacks(modules, {1: [(a[:RANK], bt[:RANK]) for a, bt in rows[1]], 3: rows[3]}),
        slots,
        scales,
        before,
    )
    assert rel_error(outs[1], expected) < 1e-5


def test_rows_checked_for_another_group_are_refused():
    group = kernels.LoRAModules(fused_group(torch.float32))
    rows = placed_rows(torch.float32, RANK)
    wider = kernels.slot_rows(rows, D_IN, D_OUTS, RANK + 2, torch.float32, "cpu")
    with pytest.raises(ValueError, match="checked for"):
        group.place(0, wider)
    strided = [(torch.randn(D_IN + 8, RANK).T[:, :D_IN], rows[0][1])] + rows[1:]
    with pytest.raises(ValueError, match="contiguous"):
        kernels.slot_rows(strided, D_IN, D_OUTS, RANK, torch.float32, "cpu")
    with pytest.raises(ValueError, match="2 modules' rows for a group of 3"):
        kernels.slot_rows(rows[:2], D_IN, D_OUTS, RANK, torch.float32, "cpu")
    assert not group.placed, "a refused placement changes nothing"


def test_bad_placements_are_named():
    group = kernels.LoRAModules(fused_group(torch.float32))
    rows = placed_rows(torch.float32, RANK)
    with pytest.raises(ValueError, match="slot 4 out of range"):
        group.place(4, rows)
    with pytest.raises(ValueError, match="2 modules' rows for a group of 3"):
        group.place(0, rows[:2])
    wrong_width = [(torch.randn(RANK, D_IN + 1), rows[0][1])] + rows[1:]
    with pytest.raises(ValueError, match="A \\[r, 72\\]"):
        group.place(0, wrong_width)
    with pytest.raises(ValueError, match="bfloat16|float32"):
        group.place(0, [(a.to(torch.bfloat16), bt) for a, bt in rows])
    strided = [(torch.randn(D_IN, RANK).T, rows[0][1])] + rows[1:]
    with pytest.raises(ValueError, match="contiguous"):
        group.place(0, strided)
    assert not group.placed, "a refused placement changes nothing"


def outputs_by_threads(x, group, slots, scales, before, num_slots, counts) -> dict:
    """lora_apply_modules' output on a copy of `before`, per thread count of `counts`."""
    outputs = {}
    threads = torch.get_num_threads()
    try:
        for count in counts:
            torch.set_num_threads(count)
            out = before.clone()
            index = kernels.lora_index(slots, num_slots)
            kernels.lora_apply_modules(x, group, slots, scales, out, index=index)
            outputs[count] = out
    finally:
        torch.set_num_threads(threads)
    return outputs


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tokens", [1, 3, 4, 9, 40])
def test_any_thread_count_gives_the_same_bits(dtype, tokens):
    """The native call splits a batch between threads by rows, by columns or not at all, as
    its size says; each row's sums are the same whichever thread makes them, so one thread
    and several give bit-equal outputs (float32 is bit-equal to the one-thread path), and
    both match the float64 reference. A share given another share's rows, y scratch or
    output rows would not."""
    torch.manual_seed(tokens)
    modules = fused_group(dtype)
    group = kernels.LoRAModules(modules, gemm_rows=0)
    assert group.table is not None, lora_cpu.native_lora_error()
    slots = torch.sort(torch.randint(-1, SLOTS, (tokens,)))[0]
    x = torch.randn(tokens, D_IN, dtype=dtype)
    scales = torch.rand(SLOTS) + 0.5
    before = torch.randn(tokens, sum(D_OUTS), dtype=dtype)
    outputs = outputs_by_threads(x, group, slots, scales, before, SLOTS, (1, 2, 3))
    assert torch.equal(outputs[1], outputs[2]) and torch.equal(outputs[1], outputs[3])
    bound = 1e-5 if dtype == torch.float32 else 2e-2
    assert rel_error(outputs[2], reference(x, modules, slots, scales, before)) < bound


def distinct(slots: torch.Tensor) -> int:
    return len(set(slots.tolist()) - {-1})


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rows_are_shared_by_the_weights_they_read(dtype):
    """Two threads share a decode batch by what its rows read, not by their count: a popular
    slot's 32 rows beside 32 slots of one row each (power-law adapters) give the popular
    slot's thread more rows and fewer slots to read; single rows of high-rank slots beside
    low-rank ones give the high ranks' thread fewer rows. A batch of base rows alone is cut
    by count. Whatever the cut, one thread and two give the same bits, matching the float64
    reference."""
    torch.manual_seed(21)
    native = lora_cpu.native_lora()
    assert native is not None, lora_cpu.native_lora_error()
    modules = fused_group(dtype, slots=40, rank=8, empty=None)
    group = kernels.LoRAModules(modules, gemm_rows=0)
    placements = {slot: placed_rows(dtype, 1) for slot in range(33, 37)}
    for slot, rows in placements.items():  # rank 1, beside slots at rank 8
        group.place(slot, rows)
    popular = torch.cat([torch.zeros(32, dtype=torch.int64), torch.arange(1, 33)])
    mixed = torch.tensor([29, 30, 31, 32, 33, 34, 35, 36])
    table, count = group.table, len(group.modules)
    shares = native.row_shares(table, count, popular, 2)
    assert shares[0] == 0 and shares[2] == 64
    first, second = popular[: shares[1]], popular[shares[1] :]
    assert shares[1] > 32, f"cut at {shares[1]}: by count, not by the weights read"
    assert distinct(first) < distinct(second)

    shares = native.row_shares(table, count, mixed, 2)
    assert 0 < shares[1] < 4, f"cut at {shares[1]}: the rank-8 rows weigh more"

    base_only = torch.full((9,), -1, dtype=torch.int64)
    assert native.row_shares(table, count, base_only, 3) == [0, 3, 6, 9]

    stacks = as_stacks(modules, placements)
    for slots in (popular, mixed):
        x = torch.randn(slots.shape[0], D_IN, dtype=dtype)
        scales = torch.rand(40) + 0.5
        before = torch.randn(slots.shape[0], sum(D_OUTS), dtype=dtype)
        outputs = outputs_by_threads(x, group, slots, scales, before, 40, (1, 2))
        assert torch.equal(outputs[1], outputs[2])
        bound = 1e-5 if dtype == torch.float32 else 2e-2
        assert rel_error(outputs[2], reference(x, stacks, slots, scales, before)) < bound
