"""kernels/lora_segment_gemm.py: a batch's long runs of one slot go through torch's products
(oneDNN in bf16, the BLAS in float32), the rest through the native per-token kernel, and every
row still gets its own slot's adapter at that slot's own rank (float64 reference); the
threshold is read from the dtype and the CPU's flags once, when a group is prepared, and
LORAGATE_LORA_GEMM_ROWS overrides it for both dtypes."""

import pytest
import torch
from kernel_reference import rel_error
from test_lora_modules import D_IN, D_OUTS, SLOTS, as_stacks, fused_group, placed_rows
from test_lora_modules import reference as module_reference

from loragate import kernels
from loragate.kernels import lora_modules, lora_segment_gemm
from loragate.kernels.cpu_isa import avx2_without_avx512, cpu_flags, has_amx
from loragate.kernels.lora_segment_gemm import (
    AMX_MIN_ROWS,
    AMX_ROW_RANKS,
    AVX512_BF16_MIN_ROWS,
    FLOAT32_AVX2_MIN_ROWS,
    FLOAT32_AVX2_ROW_RANKS,
    GEMM_ROWS_ENV,
    TILE_ROWS_ENV,
    gemm_min_rows,
    gemm_row_ranks,
    long_segments,
    worth_a_product,
)
from loragate.kernels.lora_torch import NATIVE_MAX_SINGLE_SLOT_TOKENS

AMX = frozenset({"avx512f", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8"})
AVX512_BF16 = frozenset({"avx512f", "avx512_bf16"})
AVX2 = frozenset({"avx2", "fma"})


def record_product_runs(monkeypatch) -> list:
    """The runs each call sends to the products (lora_modules' apply_long_segments), in a
    list that grows as calls are made; the products still run."""
    calls = []
    real = lora_segment_gemm.apply_long_segments
    monkeypatch.setattr(
        "loragate.kernels.lora_modules.apply_long_segments",
        lambda *args: calls.append(args[1]) or real(*args),
    )
    return calls


def test_the_threshold_follows_the_cpu_and_the_dtype(monkeypatch, tmp_path):
    monkeypatch.delenv(GEMM_ROWS_ENV, raising=False)
    assert gemm_min_rows(torch.bfloat16, AMX) == AMX_MIN_ROWS
    assert gemm_min_rows(torch.bfloat16, AVX512_BF16) == AVX512_BF16_MIN_ROWS
    assert AVX512_BF16_MIN_ROWS > AMX_MIN_ROWS, "vdpbf16ps wins longer runs than AMX does"
    assert gemm_min_rows(torch.bfloat16, AVX2) is None
    assert gemm_min_rows(torch.float32, AVX2) == FLOAT32_AVX2_MIN_ROWS
    for flags in (AMX, AVX512_BF16):
        assert gemm_min_rows(torch.float32, flags) is None, "not measured: the native loop"
    for flags in (AMX, AVX512_BF16, AVX2):
        assert gemm_min_rows(torch.float16, flags) is None
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu avx2 amx_tile amx_bf16 avx512_bf16\n")
    assert has_amx(cpu_flags(cpuinfo)) and not has_amx(cpu_flags(tmp_path / "missing"))
    assert avx2_without_avx512(AVX2) and not avx2_without_avx512(AVX512_BF16 | AVX2)
    assert gemm_row_ranks(torch.bfloat16, AMX) == AMX_ROW_RANKS, "AMX weighs rows by rank"
    for flags in (AVX512_BF16, AVX2):
        assert gemm_row_ranks(torch.bfloat16, flags) is None
    assert gemm_row_ranks(torch.float32, AVX2) == FLOAT32_AVX2_ROW_RANKS, "so does AVX2's sgemm"
    for flags in (AMX, AVX512_BF16):
        assert gemm_row_ranks(torch.float32, flags) is None
    assert gemm_row_ranks(torch.float16, AVX2) is None
    monkeypatch.setenv(GEMM_ROWS_ENV, "16")
    assert gemm_row_ranks(torch.bfloat16, AMX) is None, "the override sets rows alone"
    assert gemm_row_ranks(torch.float32, AVX2) is None
    for flags in (AMX, AVX512_BF16, AVX2):
        assert gemm_min_rows(torch.bfloat16, flags) == 16
        assert gemm_min_rows(torch.float32, flags) == 16, "the override applies to float32"
    assert gemm_min_rows(torch.float16, AVX2) is None, "the native kernel takes no float16"
    monkeypatch.setenv(GEMM_ROWS_ENV, "0")
    assert gemm_min_rows(torch.bfloat16, AMX) is None
    assert gemm_min_rows(torch.float32, AVX2) is None
    monkeypatch.setenv(GEMM_ROWS_ENV, "many")
    with pytest.raises(ValueError, match=GEMM_ROWS_ENV):
        gemm_min_rows(torch.bfloat16, AMX)


def test_a_group_reads_the_threshold_once(monkeypatch):
    """LoRAModules reads the threshold when it is prepared, not on each call: the
    environment changed afterwards changes nothing; `gemm_rows` sets it (0: never)."""
    monkeypatch.setenv(GEMM_ROWS_ENV, "32")
    modules = fused_group(torch.float32)
    group = kernels.LoRAModules(modules)
    assert group.gemm_rows == 32
    assert kernels.LoRAModules(modules, gemm_rows=7).gemm_rows == 7
    assert kernels.LoRAModules(modules, gemm_rows=0).gemm_rows is None
    with pytest.raises(ValueError, match="gemm_rows"):
        kernels.LoRAModules(modules, gemm_rows=-1)
    monkeypatch.setenv(GEMM_ROWS_ENV, "0")

    def no_reading(*args):
        raise AssertionError("the threshold was read on a call")

    monkeypatch.setattr(lora_segment_gemm, "gemm_min_rows", no_reading)
    monkeypatch.setattr("loragate.kernels.lora_modules.gemm_min_rows", no_reading)
    calls = record_product_runs(monkeypatch)
    slots = batch_slots()
    x = torch.randn(slots.shape[0], D_IN)
    out = torch.zeros(slots.shape[0], sum(D_OUTS))
    index = kernels.lora_index(slots, SLOTS)
    kernels.lora_apply_modules(x, group, slots, torch.ones(SLOTS), out, index=index)
    assert calls == [((0, 0, 40), (3, 43, 113))], "still split at the 32 read when prepared"


def batch_slots() -> torch.Tensor:
    """Sorted as the engine sorts a step: slot 0's prompt chunk (40 rows), slot 1 decoding
    (3 rows), slot 3's prompt chunk (70 rows), then base-only rows."""
    return torch.tensor([0] * 40 + [1] * 3 + [3] * 70 + [-1] * 5)


def test_long_runs_are_found_once_per_index():
    slots = batch_slots()
    index = kernels.lora_index(slots, SLOTS)
    split = long_segments(index, 32)
    assert split.runs == ((0, 0, 40), (3, 43, 113))
    assert split.native_rows == 3
    expected = slots.clone()
    expected[:40], expected[43:113] = -1, -1
    assert torch.equal(split.native_slot_ids, expected)
    assert long_segments(index, 32) is split, "worked out once per index"
    assert long_segments(index, 71) is None, "no run that long"
    # As a step orders them: a prompt chunk's rows first, then decoding rows of any slot.
    step = torch.tensor([3] * 40 + [1, 0, -1, 3, 1])
    split = long_segments(kernels.lora_index(step, SLOTS), 32)
    assert split.runs == ((3, 0, 40),) and split.native_rows == 4
    assert torch.equal(split.native_slot_ids, torch.tensor([-1] * 40 + [1, 0, -1, 3, 1]))
    scattered = torch.tensor([0, 1] * 40)
    assert long_segments(kernels.lora_index(scattered, SLOTS), 32) is None, "no run of 32"


def split_and_native(dtype, placed: bool, seed: int, monkeypatch):
    """One batch (batch_slots) through a group that splits runs of 32 rows and one that
    never splits, over the same weights (slot 3 placed at rank 2 below the group's 6, leaving
    module 1 alone, if `placed`); returns both outputs, the float64 reference, the output
    before and the runs the products took."""
    torch.manual_seed(seed)
    modules = fused_group(dtype)
    placements = {3: placed_rows(dtype, 2, skip=1)} if placed else {}
    slots = batch_slots()
    x = torch.randn(slots.shape[0], D_IN, dtype=dtype)
    scales = torch.rand(SLOTS) + 0.5
    before = torch.randn(slots.shape[0], sum(D_OUTS), dtype=dtype)
    calls = record_product_runs(monkeypatch)
    outputs = []
    for rows in (32, 0):
        group = kernels.LoRAModules(modules, gemm_rows=rows)
        assert group.table is not None
        for slot, placed_at in placements.items():
            group.place(slot, placed_at)
        fused = before.clone()
        index = kernels.lora_index(slots, SLOTS)
        kernels.lora_apply_modules(x, group, slots, scales, fused, index=index)
        outputs.append(fused)
    expected = module_reference(x, as_stacks(modules, placements), slots, scales, before)
    return *outputs, expected, before, calls


@pytest.mark.parametrize("placed", [False, True], ids=["stacks", "placed at own ranks"])
def test_bf16_runs_on_products_match_the_reference(placed, monkeypatch):
    """Every row its own slot's rows, at that slot's rank: the split output against float64
    and against the native kernel alone, within the bf16 rule; base rows untouched."""
    split, native, expected, before, calls = split_and_native(
        torch.bfloat16, placed, 5, monkeypatch
    )
    assert calls == [((0, 0, 40), (3, 43, 113))], "the long runs went through the products"
    assert rel_error(split, expected) < 2e-2
    assert rel_error(split, native.double()) < 2e-2
    slots = batch_slots()
    assert torch.equal(split[slots < 0], before[slots < 0]), "base rows must not change"


@pytest.mark.parametrize("placed", [False, True], ids=["stacks", "placed at own ranks"])
def test_float32_runs_on_products_match_the_reference(placed, monkeypatch):
    """float32: the split's adapter output (out minus what was there) against float64 within
    float32 rounding, as close as the native kernel's own; base rows untouched. A run given
    another slot's rows, rank or scale, or added twice, is off by the size of the output."""
    split, native, expected, before, calls = split_and_native(torch.float32, placed, 9, monkeypatch)
    assert calls == [((0, 0, 40), (3, 43, 113))], "the long runs went through the products"
    delta = expected - before.double()
    assert rel_error(split - before, delta) < 1e-5
    assert rel_error(native - before, delta) < 1e-5
    slots = batch_slots()
    assert torch.equal(split[slots < 0], before[slots < 0]), "base rows must not change"


@pytest.mark.parametrize(
    "flags, dtype, threshold",
    [
        (AVX512_BF16, torch.bfloat16, AVX512_BF16_MIN_ROWS),
        (AVX512_BF16, torch.float32, None),
        (AVX2, torch.bfloat16, None),
    ],
    ids=["avx512_bf16-bf16", "avx512_bf16-float32", "avx2-bf16"],
)
def test_the_cpu_sends_a_long_prompt_chunk_to_the_products(flags, dtype, threshold, monkeypatch):
    """With no override, on a CPU with these flags: a prompt chunk of `threshold` rows of one
    slot beside decoding rows goes through the products, a shorter one stays native, and both
    match the float64 reference; where there is no threshold, no chunk splits."""
    monkeypatch.delenv(GEMM_ROWS_ENV, raising=False)
    monkeypatch.setattr(lora_segment_gemm, "this_cpu_flags", lambda: flags)
    calls = record_product_runs(monkeypatch)
    torch.manual_seed(11)
    scales = torch.rand(SLOTS) + 0.5
    modules = fused_group(dtype)
    group = kernels.LoRAModules(modules)
    assert group.gemm_rows == threshold
    longest = AVX512_BF16_MIN_ROWS if threshold is None else threshold
    for chunk in (longest - 1, longest):
        calls.clear()
        slots = torch.tensor([3] * chunk + [0, 1, 2, 1, -1])  # slot 2 is empty
        x = torch.randn(slots.shape[0], D_IN, dtype=dtype)
        before = torch.randn(slots.shape[0], sum(D_OUTS), dtype=dtype)
        out = before.clone()
        index = kernels.lora_index(slots, SLOTS)
        kernels.lora_apply_modules(x, group, slots, scales, out, index=index)
        split = threshold is not None and chunk >= threshold
        assert calls == ([((3, 0, chunk),)] if split else []), chunk
        expected = module_reference(x, as_stacks(modules, {}), slots, scales, before)
        bound = 2e-2 if dtype == torch.bfloat16 else 1e-5
        assert rel_error(out - before, expected - before.double()) < bound
        assert torch.equal(out[slots < 0], before[slots < 0]), "base rows must not change"


def test_a_run_is_weighed_by_its_slots_own_rank():
    """With a rows-times-rank floor, a run stays native unless its rows times its slot's own
    rank reach it; the native rows are then the run's again."""
    slots = batch_slots()
    index = kernels.lora_index(slots, SLOTS)
    split = long_segments(index, 32)
    ranks = {0: 8, 3: 2}
    kept = worth_a_product(index, split, 300, ranks.__getitem__)
    assert kept.runs == ((0, 0, 40),), "40 x 8 reaches 300; 70 x 2 does not"
    assert kept.native_rows == 73
    expected = slots.clone()
    expected[:40] = -1
    assert torch.equal(kept.native_slot_ids, expected)
    assert worth_a_product(index, split, 300, ranks.__getitem__) is kept, "once per index"
    assert worth_a_product(index, split, 140, ranks.__getitem__) is split, "both kept"
    assert worth_a_product(index, split, 321, ranks.__getitem__) is None, "none kept"


@pytest.mark.parametrize(
    "flags, dtype, min_rows, row_ranks, bound",
    [
        (AMX, torch.bfloat16, AMX_MIN_ROWS, AMX_ROW_RANKS, 2e-2),
        (AVX2, torch.float32, FLOAT32_AVX2_MIN_ROWS, FLOAT32_AVX2_ROW_RANKS, 1e-5),
    ],
    ids=["amx-bf16", "avx2-float32"],
)
def test_a_chunk_goes_to_the_products_by_rows_times_rank(
    flags, dtype, min_rows, row_ranks, bound, monkeypatch
):
    """On a CPU with AMX (bf16), or with AVX2 and no AVX-512 (float32), a stacked slot of the
    group's rank 6 splits from row_ranks / 6 rows, not from the rows' floor; every chunk
    matches the float64 reference. (AVX2's floor is scaled down with it here, as rank 6
    times 2048 rows never reaches it: what is tested is that rows times rank decides.) On
    AMX the products are what runs where the tiles are turned off (lora_tiles.h: they take
    these runs by default, tests/kernels/test_lora_tiles.py)."""
    monkeypatch.delenv(GEMM_ROWS_ENV, raising=False)
    monkeypatch.setenv(TILE_ROWS_ENV, "0")
    monkeypatch.setattr(lora_segment_gemm, "this_cpu_flags", lambda: flags)
    if dtype == torch.float32:
        assert row_ranks // 6 > 2048, "no chunk of the native path's reaches it at rank 6"
        row_ranks = 6 * min_rows + 600
        monkeypatch.setattr(lora_segment_gemm, "FLOAT32_AVX2_ROW_RANKS", row_ranks)
    calls = record_product_runs(monkeypatch)
    torch.manual_seed(13)
    scales = torch.rand(SLOTS) + 0.5
    modules = fused_group(dtype)
    group = kernels.LoRAModules(modules)
    assert (group.gemm_rows, group.gemm_row_ranks) == (min_rows, row_ranks)
    assert group.rank == 6
    needed = -(-row_ranks // group.rank)
    for chunk in (min_rows, needed - 1, needed):
        calls.clear()
        slots = torch.tensor([3] * chunk + [0, 1, 2, 1, -1])
        x = torch.randn(slots.shape[0], D_IN, dtype=dtype)
        before = torch.randn(slots.shape[0], sum(D_OUTS), dtype=dtype)
        out = before.clone()
        kernels.lora_apply_modules(
            x, group, slots, scales, out, index=kernels.lora_index(slots, SLOTS)
        )
        assert calls == ([((3, 0, chunk),)] if chunk == needed else []), chunk
        expected = module_reference(x, as_stacks(modules, {}), slots, scales, before)
        assert rel_error(out - before, expected - before.double()) < bound
        assert torch.equal(out[slots < 0], before[slots < 0]), "base rows must not change"


def test_a_placed_slot_is_weighed_at_its_own_rank(monkeypatch):
    """Slot 3 placed at rank 2 (under the group's 6): its 70-row run times 2 misses a floor
    that slot 0's 40 rows times 6 reach, so only slot 0's run takes the products; every row
    still matches the float64 reference."""
    calls = record_product_runs(monkeypatch)
    torch.manual_seed(17)
    modules = fused_group(torch.bfloat16)
    placements = {3: placed_rows(torch.bfloat16, 2, skip=1)}
    group = kernels.LoRAModules(modules, gemm_rows=32)
    group.gemm_row_ranks = 200  # 40 x 6 = 240 reaches it, 70 x 2 = 140 does not
    group.place(3, placements[3])
    assert (group.own_rank(0), group.own_rank(3)) == (6, 2)
    slots = batch_slots()
    x = torch.randn(slots.shape[0], D_IN, dtype=torch.bfloat16)
    scales = torch.rand(SLOTS) + 0.5
    before = torch.randn(slots.shape[0], sum(D_OUTS), dtype=torch.bfloat16)
    out = before.clone()
    kernels.lora_apply_modules(x, group, slots, scales, out, index=kernels.lora_index(slots, SLOTS))
    assert calls == [((0, 0, 40),)]
    expected = module_reference(x, as_stacks(modules, placements), slots, scales, before)
    assert rel_error(out - before, expected - before.double()) < 2e-2


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_one_slots_long_prompt_goes_native_where_a_rule_splits_it(dtype, monkeypatch):
    """A batch of one slot's 200 rows (a prompt chunk alone): a group with a split rule takes
    it on the native path, whose rule sends the run to the products (over
    NATIVE_MAX_SINGLE_SLOT_TOKENS rows: no cap there); a group without one leaves it to the
    per-slot matmuls. Both match the float64 reference."""
    paths = []
    real_products = lora_segment_gemm.apply_long_segments
    real_per_slot = lora_modules._apply_per_slot
    monkeypatch.setattr(
        lora_modules,
        "apply_long_segments",
        lambda *args: paths.append("products") or real_products(*args),
    )
    monkeypatch.setattr(
        lora_modules,
        "_apply_per_slot",
        lambda *args: paths.append("per slot") or real_per_slot(*args),
    )
    torch.manual_seed(19)
    modules = fused_group(dtype)
    placements = {3: placed_rows(dtype, 4)}
    rows = NATIVE_MAX_SINGLE_SLOT_TOKENS + 72
    slots = torch.full((rows,), 3)
    x = torch.randn(rows, D_IN, dtype=dtype)
    scales = torch.rand(SLOTS) + 0.5
    before = torch.randn(rows, sum(D_OUTS), dtype=dtype)
    expected = module_reference(x, as_stacks(modules, placements), slots, scales, before)
    bound = 2e-2 if dtype == torch.bfloat16 else 1e-5
    for gemm_rows, path in ((32, "products"), (0, "per slot")):
        paths.clear()
        group = kernels.LoRAModules(modules, gemm_rows=gemm_rows, tile_rows=0)
        group.place(3, placements[3])
        out = before.clone()
        index = kernels.lora_index(slots, SLOTS)
        kernels.lora_apply_modules(x, group, slots, scales, out, index=index)
        assert paths == [path], gemm_rows
        assert rel_error(out - before, expected - before.double()) < bound
