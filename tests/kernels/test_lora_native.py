"""The native CPU LoRA kernels (kernels/lora_cpu.c) against the float64 per-token reference.

They serve decode-sized batches over several adapters, with the engine's slot layout (B
stored transposed); the shapes here also cover the tails of their vector loops: d_in not a
multiple of 16, ranks not a multiple of 4, d_out not a multiple of 64 and over one 256-column
chunk, output rows that are a column slice of a wider fused output.
"""

import pytest
import torch
from kernel_reference import lora_expand_reference, lora_shrink_reference, rel_error

from loragate import kernels
from loragate.kernels import lora_cpu, lora_torch


@pytest.fixture(scope="module")
def native():
    loaded = lora_cpu.native_lora()
    assert loaded is not None, f"native LoRA kernels did not build: {lora_cpu.native_lora_error()}"
    return loaded


def engine_layout(num_slots, rank, d_in, d_out):
    """A [S, r, d_in] and Bt [S, r, d_out], each slot a random adapter (slot 2 left zero)."""
    a = torch.randn(num_slots, rank, d_in)
    bt = torch.randn(num_slots, rank, d_out)
    a[2], bt[2] = 0, 0
    return a, bt


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(
    "rank, d_in, d_out", [(8, 576, 960), (6, 72, 300), (3, 16, 64), (24, 1536, 576), (1, 5, 7)]
)
def test_native_shrink_and_expand_match_reference(native, threads, rank, d_in, d_out):
    torch.manual_seed(rank * 1000 + d_in)
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        a, bt = engine_layout(5, rank, d_in, d_out)
        slots = torch.tensor([3, -1, 0, 0, 4, 2, -1, 1, 3, 3, 0, 4, -1])
        x = torch.randn(slots.shape[0], d_in)
        y = native.shrink(x, a, slots)
        assert rel_error(y, lora_shrink_reference(x, a, slots)) < 1e-5
        assert not y[slots < 0].any(), "rows without an adapter must shrink to zeros"

        fused = torch.randn(slots.shape[0], d_out + 40)  # out is a column slice of it
        out = fused[:, 20 : 20 + d_out]
        before, untouched = out.clone(), fused[:, :20].clone()
        scales = torch.rand(5) + 0.5
        native.expand(y, bt, scales, out, slots)
        expected = lora_expand_reference(y, bt.transpose(1, 2), slots, scales, before)
        assert rel_error(out, expected) < 1e-5
        assert torch.equal(out[slots < 0], before[slots < 0])
        assert torch.equal(fused[:, :20], untouched), "columns outside out must not change"
    finally:
        torch.set_num_threads(previous)


# A prompt chunk's rows lie together, one slot for many rows: runs long enough for the
# kernels' tiles (three rows of one slot at a time in the shrink, RUN_TILE = 6 in the expand)
# with rows left over, beside short runs, base rows and a slot that adds nothing (2).
RUN_SLOTS = [2] + [0] * 13 + [-1] * 2 + [1] * 7 + [3] * 20 + [4] * 6 + [0] * 5 + [3, 3]


@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-5), (torch.bfloat16, 1e-2)])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(
    "rank, d_in, d_out", [(64, 576, 1536), (8, 576, 300), (6, 72, 100), (1, 5, 7), (17, 40, 33)]
)
def test_long_runs_of_one_slot_match_reference_and_each_row_alone(
    native, dtype, tolerance, threads, rank, d_in, d_out
):
    """Runs of one slot's rows take tiles of several rows at a time; each row's sums are the
    ones it gets alone, term by term: bit-equal to the row computed by itself, and within
    rounding of the float64 reference."""
    torch.manual_seed(rank * 100 + d_in + d_out)
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        a, bt = (t.to(dtype) for t in engine_layout(5, rank, d_in, d_out))
        slots = torch.tensor(RUN_SLOTS)
        x = torch.randn(slots.shape[0], d_in).to(dtype)
        scales = torch.rand(5) + 0.5
        y = native.shrink(x, a, slots)
        assert rel_error(y, lora_shrink_reference(x, a, slots)) < tolerance
        before = torch.randn(slots.shape[0], d_out + 40).to(dtype)[:, 20 : 20 + d_out]
        out = before.clone()
        native.expand(y, bt, scales, out, slots)
        expected = lora_expand_reference(y, bt.transpose(1, 2), slots, scales, before)
        assert rel_error(out, expected) < tolerance
        assert torch.equal(out[slots < 0], before[slots < 0])

        for row in range(slots.shape[0]):  # each row alone: the one-row path
            alone_y = native.shrink(x[row : row + 1], a, slots[row : row + 1])
            assert torch.equal(alone_y, y[row : row + 1]), f"row {row}'s shrink"
            alone = before[row : row + 1].clone()
            native.expand(y[row : row + 1], bt, scales, alone, slots[row : row + 1])
            assert torch.equal(alone, out[row : row + 1]), f"row {row}'s expand"
    finally:
        torch.set_num_threads(previous)


def test_engine_calls_take_the_native_path_and_agree_with_the_grouped_one(native, monkeypatch):
    """lora_shrink / lora_expand on the engine's layout, several slots, decode-sized: native.
    Forcing the grouped matmul gives the same numbers."""
    a, bt = engine_layout(4, 8, 64, 96)
    lora_b = bt.transpose(1, 2)  # [S, d_out, r] view, as the adapter cache hands it out
    slots = torch.tensor([0, 0, 1, 3, 3, 3, -1])
    x, scales = torch.randn(7, 64), torch.rand(4)
    index = kernels.lora_index(slots, 4)

    calls = []
    for name in ("shrink", "expand"):
        real = getattr(lora_cpu.NativeLoRA, name)
        monkeypatch.setattr(
            lora_cpu.NativeLoRA,
            name,
            lambda self, *args, _real=real, _name=name: calls.append(_name) or _real(self, *args),
        )
    out = torch.randn(7, 96)
    grouped_out = out.clone()
    y = kernels.lora_shrink(x, a, slots, index=index)
    kernels.lora_expand(y, lora_b, slots, scales, out, index=index)
    assert calls == ["shrink", "expand"]

    monkeypatch.setattr(lora_torch, "native_lora", lambda: None)
    grouped_y = kernels.lora_shrink(x, a, slots, index=index)
    kernels.lora_expand(grouped_y, lora_b, slots, scales, grouped_out, index=index)
    assert calls == ["shrink", "expand"], "the grouped path must not call the native kernels"
    assert torch.allclose(y, grouped_y, atol=1e-5) and torch.allclose(out, grouped_out, atol=1e-5)


def test_a_failed_build_falls_back_to_torch_and_says_why(monkeypatch, tmp_path):
    monkeypatch.setattr(lora_cpu, "_state", {})
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    monkeypatch.setenv("LORAGATE_CACHE", str(tmp_path))
    assert lora_cpu.native_lora() is None
    assert "no-such-compiler" in lora_cpu.native_lora_error()
    a, bt = engine_layout(3, 4, 16, 20)
    slots = torch.tensor([0, 1, -1, 2])
    x = torch.randn(4, 16)
    y = kernels.lora_shrink(x, a, slots)
    assert rel_error(y, lora_shrink_reference(x, a, slots)) < 1e-5


def test_the_build_is_cached_per_source_and_cpu(monkeypatch, tmp_path):
    monkeypatch.setattr(lora_cpu, "_state", {})
    monkeypatch.setenv("LORAGATE_CACHE", str(tmp_path))
    assert lora_cpu.native_lora() is not None
    built = list((tmp_path / "kernels").glob("lora_cpu-*.so"))
    assert len(built) == 1
    stamp = built[0].stat().st_mtime_ns
    monkeypatch.setattr(lora_cpu, "_state", {})
    assert lora_cpu.native_lora() is not None
    assert built[0].stat().st_mtime_ns == stamp, "a second load must reuse the built library"


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(
    "rank, d_in, d_out", [(8, 576, 960), (6, 72, 300), (7, 64, 128), (1, 5, 7), (1, 8, 64)]
)
def test_native_bfloat16_kernels_match_reference(native, threads, rank, d_in, d_out):
    """bf16 in and out, float32 sums: within bf16 rounding of the float64 result, and
    lora_apply's float32 intermediate no worse than shrink then expand."""
    torch.manual_seed(rank * 1000 + d_in + 7)
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        a, bt = (t.to(torch.bfloat16) for t in engine_layout(5, rank, d_in, d_out))
        slots = torch.tensor([3, -1, 0, 0, 4, 2, -1, 1, 3, 3, 0, 4, -1])
        x = torch.randn(slots.shape[0], d_in).to(torch.bfloat16)
        y = native.shrink(x, a, slots)
        assert y.dtype == torch.bfloat16
        assert rel_error(y, lora_shrink_reference(x, a, slots)) < 1e-2
        assert not y[slots < 0].any()

        fused = torch.randn(slots.shape[0], d_out + 40).to(torch.bfloat16)
        out = fused[:, 20 : 20 + d_out]
        before, untouched = out.clone(), fused[:, :20].clone()
        scales = torch.rand(5) + 0.5
        native.expand(y, bt, scales, out, slots)
        expected = lora_expand_reference(y, bt.transpose(1, 2), slots, scales, before)
        assert rel_error(out, expected) < 1e-2
        assert torch.equal(out[slots < 0], before[slots < 0])
        assert torch.equal(fused[:, :20], untouched)

        applied = before.clone()
        native.apply(x, a, bt, scales, applied, slots)
        y64 = lora_shrink_reference(x, a, slots)
        expected = lora_expand_reference(y64, bt.transpose(1, 2), slots, scales, before)
        assert rel_error(applied, expected) < 1e-2
        assert torch.equal(applied[slots < 0], before[slots < 0])
    finally:
        torch.set_num_threads(previous)


def test_bfloat16_engine_calls_take_the_native_path(native, monkeypatch):
    """A bf16 model's lora_apply over several slots runs natively (no conversion, no per-token
    weight copies) and agrees with the torch path."""
    a, bt = (t.to(torch.bfloat16) for t in engine_layout(4, 8, 64, 96))
    lora_b = bt.transpose(1, 2)
    slots = torch.tensor([0, 0, 1, 3, 3, 3, -1])
    x, scales = torch.randn(7, 64).to(torch.bfloat16), torch.rand(4)
    index = kernels.lora_index(slots, 4)
    calls = []
    real = lora_cpu.NativeLoRA.apply
    monkeypatch.setattr(
        lora_cpu.NativeLoRA, "apply", lambda self, *args: calls.append(1) or real(self, *args)
    )
    out = torch.randn(7, 96).to(torch.bfloat16)
    torch_out = out.clone()
    kernels.lora_apply(x, a, lora_b, slots, scales, out, index=index)
    assert calls == [1]
    monkeypatch.setattr(lora_torch, "native_lora", lambda: None)
    kernels.lora_apply(x, a, lora_b, slots, scales, torch_out, index=index)
    assert calls == [1]
    assert rel_error(out, torch_out) < 2e-2
