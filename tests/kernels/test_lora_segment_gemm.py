"""kernels/lora_segment_gemm.py: a bf16 batch's long runs of one slot go through oneDNN's
products, the rest through the native per-token kernel, and every row still gets its own
slot's adapter at that slot's own rank (float64 reference); float32 never splits, so its
output stays bit-equal to the native kernel's; the threshold is read from the CPU's flags."""

import pytest
import torch
from kernel_reference import rel_error
from test_lora_modules import D_IN, D_OUTS, SLOTS, as_stacks, fused_group, placed_rows
from test_lora_modules import reference as module_reference

from loragate import kernels
from loragate.kernels import lora_segment_gemm
from loragate.kernels.cpu_isa import cpu_flags, has_amx
from loragate.kernels.lora_segment_gemm import (
    AMX_MIN_ROWS,
    AVX512_BF16_MIN_ROWS,
    GEMM_ROWS_ENV,
    gemm_min_rows,
    long_segments,
)

AMX = frozenset({"avx512f", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8"})
AVX512_BF16 = frozenset({"avx512f", "avx512_bf16"})
AVX2 = frozenset({"avx2", "fma"})


def test_the_threshold_follows_the_cpu_and_the_dtype(monkeypatch, tmp_path):
    monkeypatch.delenv(GEMM_ROWS_ENV, raising=False)
    assert gemm_min_rows(torch.bfloat16, AMX) == AMX_MIN_ROWS
    assert gemm_min_rows(torch.bfloat16, AVX512_BF16) == AVX512_BF16_MIN_ROWS
    assert AVX512_BF16_MIN_ROWS > AMX_MIN_ROWS, "vdpbf16ps wins longer runs than AMX does"
    assert gemm_min_rows(torch.bfloat16, AVX2) is None
    for flags in (AMX, AVX512_BF16, AVX2):
        assert gemm_min_rows(torch.float32, flags) is None, "float32 stays on the native path"
        assert gemm_min_rows(torch.float16, flags) is None
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu avx2 amx_tile amx_bf16 avx512_bf16\n")
    assert has_amx(cpu_flags(cpuinfo)) and not has_amx(cpu_flags(tmp_path / "missing"))
    monkeypatch.setenv(GEMM_ROWS_ENV, "16")
    assert gemm_min_rows(torch.bfloat16, AVX2) == 16
    assert gemm_min_rows(torch.float32, AMX) is None
    monkeypatch.setenv(GEMM_ROWS_ENV, "0")
    assert gemm_min_rows(torch.bfloat16, AMX) is None
    monkeypatch.setenv(GEMM_ROWS_ENV, "many")
    with pytest.raises(ValueError, match=GEMM_ROWS_ENV):
        gemm_min_rows(torch.bfloat16, AMX)


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


@pytest.mark.parametrize("placed", [False, True], ids=["stacks", "placed at own ranks"])
def test_bf16_runs_on_products_match_the_reference(placed, monkeypatch):
    """Every row its own slot's rows, at that slot's rank (slot 3 placed at rank 2 below the
    group's 6, leaving module 1 alone): the split output against float64 and against the
    native kernel alone, within the bf16 rule; base rows untouched."""
    torch.manual_seed(5)
    dtype = torch.bfloat16
    modules = fused_group(dtype)
    group = kernels.LoRAModules(modules)
    assert group.table is not None
    placements = {3: placed_rows(dtype, 2, skip=1)} if placed else {}
    for slot, rows in placements.items():
        group.place(slot, rows)
    slots = batch_slots()
    x = torch.randn(slots.shape[0], D_IN, dtype=dtype)
    scales = torch.rand(SLOTS) + 0.5
    before = torch.randn(slots.shape[0], sum(D_OUTS), dtype=dtype)

    def run(rows: str) -> torch.Tensor:
        monkeypatch.setenv(GEMM_ROWS_ENV, rows)
        fused = before.clone()
        index = kernels.lora_index(slots, SLOTS)
        kernels.lora_apply_modules(x, group, slots, scales, fused, index=index)
        return fused

    calls = []
    real = lora_segment_gemm.apply_long_segments
    monkeypatch.setattr(
        "loragate.kernels.lora_modules.apply_long_segments",
        lambda *args: calls.append(args[1]) or real(*args),
    )
    split, native = run("32"), run("0")
    assert calls == [((0, 0, 40), (3, 43, 113))], "the long runs went through the products"
    expected = module_reference(x, as_stacks(modules, placements), slots, scales, before)
    assert rel_error(split, expected) < 2e-2
    assert rel_error(split, native.double()) < 2e-2
    assert torch.equal(split[slots < 0], before[slots < 0]), "base rows must not change"


def test_float32_stays_bit_equal_to_the_native_kernel(monkeypatch):
    torch.manual_seed(9)
    modules = fused_group(torch.float32)
    group = kernels.LoRAModules(modules)
    slots = batch_slots()
    x = torch.randn(slots.shape[0], D_IN)
    scales = torch.rand(SLOTS) + 0.5
    before = torch.randn(slots.shape[0], sum(D_OUTS))
    outputs = []
    for rows in ("16", "0"):
        monkeypatch.setenv(GEMM_ROWS_ENV, rows)
        fused = before.clone()
        kernels.lora_apply_modules(
            x, group, slots, scales, fused, index=kernels.lora_index(slots, SLOTS)
        )
        outputs.append(fused)
    assert torch.equal(outputs[0], outputs[1])


def test_avx512_bf16_sends_a_long_prompt_chunk_to_the_products(monkeypatch):
    """With no override, on a CPU with AVX512-BF16 and no AMX: a bf16 prompt chunk of
    AVX512_BF16_MIN_ROWS rows of one slot beside decoding rows goes through the products, a
    shorter one stays native, and both match the float64 reference; float32 never splits."""
    monkeypatch.delenv(GEMM_ROWS_ENV, raising=False)
    monkeypatch.setattr(lora_segment_gemm, "this_cpu_flags", lambda: AVX512_BF16)
    calls = []
    real = lora_segment_gemm.apply_long_segments
    monkeypatch.setattr(
        "loragate.kernels.lora_modules.apply_long_segments",
        lambda *args: calls.append(args[1]) or real(*args),
    )
    torch.manual_seed(11)
    scales = torch.rand(SLOTS) + 0.5
    for dtype in (torch.bfloat16, torch.float32):
        modules = fused_group(dtype)
        group = kernels.LoRAModules(modules)
        for chunk in (AVX512_BF16_MIN_ROWS - 1, AVX512_BF16_MIN_ROWS):
            calls.clear()
            slots = torch.tensor([3] * chunk + [0, 1, 2, 1, -1])  # slot 2 is empty
            x = torch.randn(slots.shape[0], D_IN, dtype=dtype)
            before = torch.randn(slots.shape[0], sum(D_OUTS), dtype=dtype)
            out = before.clone()
            index = kernels.lora_index(slots, SLOTS)
            kernels.lora_apply_modules(x, group, slots, scales, out, index=index)
            split = dtype == torch.bfloat16 and chunk >= AVX512_BF16_MIN_ROWS
            assert calls == ([((3, 0, chunk),)] if split else []), (dtype, chunk)
            expected = module_reference(x, as_stacks(modules, {}), slots, scales, before)
            assert rel_error(out, expected) < (2e-2 if dtype == torch.bfloat16 else 1e-5)
            assert torch.equal(out[slots < 0], before[slots < 0]), "base rows must not change"
