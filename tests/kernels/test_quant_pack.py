"""Weights into loragate's integer formats (kernels/quant_pack.py): float weights quantized
as vLLM's on-the-fly int8 (per output channel) and int4 (groups of 128) against a float64
reference quantizer; AWQ and GPTQ tensors, written by the float64 reference packers of
tests/quant_checkpoint_testlib.py, repacked to exactly the weights they stand for."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from quant_checkpoint_testlib import awq_pack, gptq_pack, int_reference

from loragate.kernels import quant_linear
from loragate.kernels.quant_blocks import QuantizedWeight, StackedWeights, stack_rows
from loragate.kernels.quant_dequant import dequantize
from loragate.kernels.quant_pack import (
    awq_weight,
    gptq_weight,
    int4_group_size,
    quantize_int4,
    quantize_int8,
)


def _weights(rows: int, cols: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(rows, cols, generator=gen) * cols**-0.5


def _agree_off_ties(got: np.ndarray, exact: np.ndarray, want: np.ndarray) -> None:
    """got == want wherever ``exact`` (the unrounded value) is not within 1e-3 of a tie."""
    tie = np.abs(np.abs(exact - np.floor(exact)) - 0.5) < 1e-3
    assert tie.mean() < 0.01
    assert np.array_equal(got[~tie], want[~tie])


def test_int8_is_symmetric_per_output_channel():
    w = _weights(37, 96, seed=1)
    held = quantize_int8(w)
    assert held.format == "I8_CH" and held.nbytes == 37 * (4 + 96)
    rows = held.blocks.numpy()
    d = rows[:, :4].copy().view(np.float32)[:, 0].astype(np.float64)
    w64 = w.double().numpy()
    assert np.array_equal(d, (np.abs(w.numpy()).max(axis=1) / np.float32(127)).astype(np.float64))
    q = rows[:, 4:].copy().view(np.int8).astype(np.float64)
    _agree_off_ties(q, w64 / d[:, None], np.clip(np.round(w64 / d[:, None]), -127, 127))
    assert np.abs(q).max(axis=1).min() == 127  # every row's largest weight is +-127
    deq = dequantize(held).double().numpy()
    assert np.array_equal(deq, int_reference(rows, "I8_CH", 96).astype(np.float32))
    assert (np.abs(deq - w64) <= d[:, None] / 2 * (1 + 1e-6)).all()


@pytest.mark.parametrize("cols,group", [(384, 128), (576, 64), (96, 32)])
def test_int4_is_asymmetric_in_groups_of_128_or_the_largest_that_divides(cols, group):
    w = _weights(11, cols, seed=cols)
    held = quantize_int4(w)
    assert int4_group_size(cols) == group and held.format == f"I4_G{group}"
    blocks = held.blocks.numpy().reshape(-1, 5 + group // 2)
    d = blocks[:, :4].copy().view(np.float32).astype(np.float64)
    z = blocks[:, 4:5].astype(np.float64)
    g = w.double().numpy().reshape(-1, group)
    _agree_off_ties(
        z, -g.min(axis=1, keepdims=True) / d, np.round(-g.min(axis=1, keepdims=True) / d)
    )
    q_exact = g / d
    q_want = np.clip(np.round(q_exact) + z, 0, 15)
    reference = int_reference(held.blocks.numpy(), held.format, cols).reshape(-1, group)
    q_got = np.round(reference / d + z)
    _agree_off_ties(q_got, q_exact, q_want)
    assert np.array_equal(dequantize(held).numpy(), reference.reshape(11, cols).astype(np.float32))
    assert (
        np.abs(reference - g) <= d * (0.5 + 1e-6) + np.abs(d) * (q_want != np.round(q_exact) + z)
    ).all()


def test_int4_refuses_rows_not_of_whole_groups():
    with pytest.raises(ValueError, match="multiple of 32 weights, got a row of 100"):
        quantize_int4(torch.zeros(4, 100))


@pytest.mark.parametrize("group", [128, 64])
def test_awq_gemm_tensors_repack_to_the_weights_they_hold(group):
    w = _weights(48, 256, seed=group).double().numpy()
    qweight, qzeros, scales, held = awq_pack(w, group)
    weight = awq_weight(*map(torch.from_numpy, (qweight, qzeros, scales)), group)
    assert weight.shape == (48, 256) and weight.format == f"I4_G{group}"
    assert np.array_equal(dequantize(weight).numpy(), held.astype(np.float32))
    assert np.abs(held - w).max() < 0.5 * np.abs(w).max()  # and near what was quantized


@pytest.mark.parametrize(
    "sym,offset", [(True, 1), (False, 1), (False, 0)], ids=["sym", "asym", "v2"]
)
def test_gptq_tensors_repack_to_the_weights_they_hold(sym, offset):
    w = _weights(40, 256, seed=7).double().numpy()
    w[3, :128] -= w[3, :128].min()  # a group whose zero is 0: v1 stores 15, read as 16
    qweight, qzeros, scales, _, held = gptq_pack(w, 128, sym, offset)
    weight = gptq_weight(*map(torch.from_numpy, (qweight, qzeros, scales)), 128, offset)
    assert np.array_equal(dequantize(weight).numpy(), held.astype(np.float32))


def test_gptq_act_order_holds_the_inputs_sorted_by_group_and_products_take_them_so():
    """desc_act: group g holds the inputs perm[g*64 ...], g_idx says so; the blocks hold
    them sorted, dequantize puts them back, products permute x (every native path)."""
    w = _weights(24, 256, seed=8).double().numpy()
    perm = np.random.default_rng(8).permutation(256)
    qweight, qzeros, scales, g_idx, held = gptq_pack(w, 64, False, 1, perm)
    assert not np.array_equal(g_idx, np.arange(256) // 64)
    tensors = map(torch.from_numpy, (qweight, qzeros, scales))
    weight = gptq_weight(*tensors, 64, 1, torch.from_numpy(g_idx))
    assert weight.input_order is not None
    assert np.array_equal(dequantize(weight).numpy(), held.astype(np.float32))
    x = torch.randn(5, 256)
    for rows in (1, 5):
        got = quant_linear.quantized_linear(x[:rows], weight)
        expected = x[:rows].double() @ torch.from_numpy(held).T
        assert (got.double() - expected).abs().max() < 1e-4
    with pytest.raises(ValueError, match="does not put 64 inputs in each group"):
        gptq_weight(*map(torch.from_numpy, (qweight, qzeros, scales)), 64, 1, torch.zeros(256))


def test_stacked_weights_of_different_input_orders_keep_their_own():
    w = _weights(16, 128, seed=9).double().numpy()
    parts = []
    for seed in (1, 1, 2):
        perm = np.random.default_rng(seed).permutation(128)
        qweight, qzeros, scales, g_idx, _ = gptq_pack(w, 64, True, 1, perm)
        tensors = map(torch.from_numpy, (qweight, qzeros, scales))
        parts.append(gptq_weight(*tensors, 64, 1, torch.from_numpy(g_idx)))
    same = stack_rows(parts[:2])
    assert isinstance(same, QuantizedWeight) and torch.equal(same.input_order, parts[0].input_order)
    mixed = stack_rows(parts)
    assert isinstance(mixed, StackedWeights)
    x = torch.randn(3, 128)
    full = torch.cat([dequantize(p) for p in parts])
    assert (quant_linear.quantized_linear(x, mixed) - x @ full.T).abs().max() < 1e-4


def test_mismatched_checkpoint_tensors_are_refused_naming_the_shapes():
    qweight, qzeros, scales, _ = awq_pack(_weights(16, 256, 1).double().numpy(), 128)
    with pytest.raises(ValueError, match="group_size 96 over rows of 256"):
        awq_weight(*map(torch.from_numpy, (qweight, qzeros, scales)), 96)
    with pytest.raises(ValueError, match=r"must unpack to \[2, 16\]"):
        awq_weight(
            torch.from_numpy(qweight), torch.from_numpy(qzeros[:1]), torch.from_numpy(scales), 128
        )
