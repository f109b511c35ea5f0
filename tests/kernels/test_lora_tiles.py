"""bf16 runs of one slot through tiles inside the native call (kernels/lora_tiles.h): AMX on a
CPU that has it, the tiles' emulation elsewhere (the same packing, tiling and epilogue code),
against the float64 reference, beside the loops that take every other row."""

import ctypes

import pytest
import torch
from kernel_reference import rel_error

from loragate import kernels
from loragate.kernels import _native, lora_cpu, lora_modules, lora_segment_gemm
from loragate.kernels.cpu_isa import has_amx, this_cpu_flags

D_IN = 96  # three tiles of 32 columns
D_OUTS = (80, 24, 40)  # columns past a multiple of 16, narrower than one tile, and a tile's


@pytest.fixture(scope="module")
def native():
    loaded = lora_cpu.native_lora()
    assert loaded is not None, lora_cpu.native_lora_error()
    expected = lora_cpu.TILES_NATIVE if has_amx(this_cpu_flags()) else lora_cpu.TILES_EMULATED
    assert loaded.tiles == expected, "AMX where the CPU has it, the emulation elsewhere"
    return loaded


def group_of(ranks, group_rank, dtype=torch.bfloat16, d_in=D_IN, d_outs=D_OUTS):
    """A fused group (B stored transposed, as the slots keep it) whose slots read their own
    rows at their own ranks (as the CPU tier's adapters are placed), slot 2 adding nothing
    to the second module."""
    made, start = [], 0
    for d_out in d_outs:
        made.append(
            (
                torch.zeros(len(ranks), group_rank, d_in, dtype=dtype),
                torch.zeros(len(ranks), group_rank, d_out, dtype=dtype).transpose(1, 2),
                slice(start, start + d_out),
            )
        )
        start += d_out
    modules = made
    rows = {}
    for slot, rank in enumerate(ranks):
        rows[slot] = [
            None
            if (slot, m) == (2, 1)
            else (torch.randn(rank, d_in, dtype=dtype), torch.randn(rank, d_out, dtype=dtype))
            for m, d_out in enumerate(d_outs)
        ]
    return modules, rows


def placed_group(ranks, group_rank, tile_rows, **shapes):
    """`group_of`'s group with every slot placed at its own rows, the tiles taking runs of
    `tile_rows` rows (rows alone decide) and no products; with the rows placed."""
    modules, rows = group_of(ranks, group_rank, **shapes)
    group = kernels.LoRAModules(modules, gemm_rows=0, tile_rows=tile_rows)
    for slot, slot_rows in rows.items():
        group.place(slot, slot_rows)
    return group, rows


def reference(x, rows, d_outs, slots, scales, before):
    """float64, row by row; the rank-r intermediate rounded to bf16 as PEFT's bf16 forward
    (and the kernels) round it."""
    out = before.double().clone()
    for row, slot in enumerate(slots.tolist()):
        if slot < 0:
            continue
        start = 0
        for entry, d_out in zip(rows[slot], d_outs, strict=True):
            if entry is not None:
                a, bt = entry
                y = (x[row].double() @ a.double().T).to(torch.bfloat16).double()
                out[row, start : start + d_out] += scales[slot].double() * (y @ bt.double())
            start += d_out
    return out


def run(group, x, slots, scales, fused, threads=None):
    """The group's call over the batch, on `threads` threads (torch's own count if None);
    the rows the tiles took."""
    index = kernels.lora_index(slots, group.num_slots)
    previous = torch.get_num_threads()
    torch.set_num_threads(threads or previous)
    try:
        return kernels.lora_apply_modules(x, group, slots, scales, fused, index=index)
    finally:
        torch.set_num_threads(previous)


@pytest.fixture(scope="module")
def emulated():
    """The library built with the tiles' emulation, whatever the CPU (the default build on a
    CPU without AMX is the same)."""
    source = _native.build(lora_cpu._SOURCE, defines=("LORA_TILES_EMULATED",))
    loaded = lora_cpu.NativeLoRA(ctypes.CDLL(str(source)))
    assert loaded.tiles == lora_cpu.TILES_EMULATED
    return loaded


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("tiles", ["this CPU's", "emulated"])
def test_runs_of_one_slot_on_tiles_match_the_reference(
    native, emulated, threads, tiles, monkeypatch
):
    """Slots of ranks 8 to 128 (and 24, a rank no tile divides) in runs of 15 to 70 rows beside
    base rows and single rows: each run's whole tiles of 16 rows go to the tiles, the rest of
    the batch to the loops, every row within the bf16 rule of the reference."""
    if tiles == "emulated":
        monkeypatch.setattr(lora_modules, "_native", lambda *args, **kwargs: emulated)
    torch.manual_seed(3)
    ranks = (8, 16, 24, 64, 128)
    group, rows = placed_group(ranks, group_rank=128, tile_rows=16)
    runs = [(0, 33), (-1, 3), (1, 16), (2, 40), (3, 15), (4, 70), (0, 1), (3, 2)]
    slots = torch.tensor([slot for slot, length in runs for _ in range(length)])
    x = torch.randn(len(slots), D_IN, dtype=torch.bfloat16)
    scales = torch.rand(len(ranks)) + 0.5
    fused = torch.randn(len(slots), sum(D_OUTS), dtype=torch.bfloat16)
    before = fused.clone()
    tiled = run(group, x, slots, scales, fused, threads=threads)
    # Whole tiles only: 32 of 33, 16, 32 of 40, none of 15, 64 of 70. Two threads split the
    # batch at row 90, inside slot 2's run, whose first 38 rows still hold two tiles.
    assert tiled == 144
    expected = reference(x, rows, D_OUTS, slots, scales, before)
    for row in range(len(slots)):
        assert rel_error(fused[row], expected[row]) < 2e-2, f"row {row} (slot {slots[row]})"
    assert torch.equal(fused[slots < 0], before[slots < 0]), "base-only rows must not change"


def test_the_tiles_agree_with_the_loops_and_take_no_float32(native):
    """The same batch with the tiles off goes to the loops alone; both within the bf16 rule
    of each other. float32 never takes the tiles (its loops stay bit-equal to before)."""
    torch.manual_seed(5)
    modules, rows = group_of((32, 64), group_rank=64)
    slots = torch.tensor([0] * 48 + [1] * 48)  # whole tiles for one thread or two
    x = torch.randn(len(slots), D_IN, dtype=torch.bfloat16)
    scales = torch.tensor([0.5, 2.0])
    outs = []
    for tile_rows in (16, 0):
        group = kernels.LoRAModules(modules, gemm_rows=0, tile_rows=tile_rows)
        for slot, slot_rows in rows.items():
            group.place(slot, slot_rows)
        fused = torch.zeros(len(slots), sum(D_OUTS), dtype=torch.bfloat16)
        assert run(group, x, slots, scales, fused) == (96 if tile_rows else 0)
        outs.append(fused)
    assert rel_error(outs[0], outs[1]) < 2e-2
    group, _ = placed_group((32, 64), group_rank=64, tile_rows=16, dtype=torch.float32)
    fused = torch.zeros(len(slots), sum(D_OUTS))
    assert run(group, x.float(), slots, scales, fused) == 0, "float32 runs stay on the loops"


def test_runs_shorter_than_the_rule_or_columns_off_the_tiles_stay_on_the_loops(native):
    torch.manual_seed(9)
    group, rows = placed_group((16,), group_rank=16, tile_rows=48)
    slots = torch.zeros(40, dtype=torch.long)
    x = torch.randn(40, D_IN, dtype=torch.bfloat16)
    fused = torch.zeros(40, sum(D_OUTS), dtype=torch.bfloat16)
    assert run(group, x, slots, torch.ones(1), fused) == 0, "40 rows under a rule of 48"
    # d_in not a multiple of 32 columns: no tile fits x's rows; the loops take them all.
    group, odd_rows = placed_group((16,), group_rank=16, tile_rows=16, d_in=72)
    x = torch.randn(40, 72, dtype=torch.bfloat16)
    fused = torch.zeros(40, sum(D_OUTS), dtype=torch.bfloat16)
    assert run(group, x, slots, torch.ones(1), fused) == 0
    expected = reference(x, odd_rows, D_OUTS, slots, torch.ones(1), torch.zeros_like(fused))
    assert rel_error(fused, expected) < 2e-2


def test_a_run_is_judged_whole_before_the_threads_split_it(native):
    """40 rows of one slot under a rule of 32 rows, split 20 and 20 between two threads: the
    run reaches the rule, so each thread sends its whole tile of 16 to the tiles."""
    torch.manual_seed(12)
    group, rows = placed_group((16,), group_rank=16, tile_rows=32)
    slots = torch.zeros(40, dtype=torch.long)
    x = torch.randn(40, D_IN, dtype=torch.bfloat16)
    fused = torch.zeros(40, sum(D_OUTS), dtype=torch.bfloat16)
    assert run(group, x, slots, torch.ones(1), fused, threads=2) == 32
    expected = reference(x, rows, D_OUTS, slots, torch.ones(1), torch.zeros_like(fused))
    assert rel_error(fused, expected) < 2e-2


def test_a_run_is_weighed_at_its_slots_own_rank(native):
    """A rank-8 slot's 48 rows (384 rows x rank) miss a floor of 1,000 that a rank-64 slot's
    32 rows (2,048) reach, in a group sized for rank 64: only the second run takes tiles."""
    torch.manual_seed(11)
    group, rows = placed_group((8, 64), group_rank=64, tile_rows=16)
    group.tile_row_ranks = 1000
    slots = torch.tensor([0] * 48 + [1] * 32)
    x = torch.randn(len(slots), D_IN, dtype=torch.bfloat16)
    fused = torch.zeros(len(slots), sum(D_OUTS), dtype=torch.bfloat16)
    assert run(group, x, slots, torch.ones(2), fused, threads=1) == 32
    expected = reference(x, rows, D_OUTS, slots, torch.ones(2), torch.zeros_like(fused))
    assert rel_error(fused, expected) < 2e-2


def test_the_rule_takes_tiles_on_amx_only_unless_told(monkeypatch):
    amx = frozenset({"amx_tile", "amx_bf16", "avx512_bf16", "avx512f"})
    avx512 = frozenset({"avx512_bf16", "avx512f"})
    monkeypatch.delenv(lora_segment_gemm.TILE_ROWS_ENV, raising=False)
    assert lora_segment_gemm.tile_min_rows(torch.bfloat16, amx) == lora_segment_gemm.AMX_TILE_ROWS
    assert lora_segment_gemm.tile_min_rows(torch.bfloat16, avx512) == 0, "emulated: tests only"
    assert lora_segment_gemm.tile_min_rows(torch.float32, amx) == 0
    assert lora_segment_gemm.tile_row_ranks(torch.bfloat16, amx) == (
        lora_segment_gemm.AMX_TILE_ROW_RANKS
    )
    assert lora_segment_gemm.tile_row_ranks(torch.bfloat16, avx512) == 0
    monkeypatch.delenv(lora_segment_gemm.GEMM_ROWS_ENV, raising=False)
    assert lora_segment_gemm.gemm_min_rows(torch.bfloat16, amx, tiles=True) is None, (
        "where the tiles take the runs, products take none"
    )
    assert lora_segment_gemm.gemm_min_rows(torch.bfloat16, amx) == lora_segment_gemm.AMX_MIN_ROWS
    monkeypatch.setenv(lora_segment_gemm.TILE_ROWS_ENV, "64")
    assert lora_segment_gemm.tile_min_rows(torch.bfloat16, avx512) == 64
    assert lora_segment_gemm.tile_row_ranks(torch.bfloat16, amx) == 0, "the rows alone"
    monkeypatch.setenv(lora_segment_gemm.TILE_ROWS_ENV, "0")
    assert lora_segment_gemm.tile_min_rows(torch.bfloat16, amx) == 0
    monkeypatch.setenv(lora_segment_gemm.TILE_ROWS_ENV, "some")
    with pytest.raises(ValueError, match=lora_segment_gemm.TILE_ROWS_ENV):
        lora_segment_gemm.tile_min_rows(torch.bfloat16, amx)
