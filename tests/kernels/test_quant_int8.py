"""The int8-activation mode of block-format products (kernels/quant_int8.py), against a
float64 reference over the same integers: activations quantized per 32 values exactly as
specified (scale max|x| / 127, values rounded to nearest, ties to even, in float32), and the
product of those int8 rows with the weight's float32 values. Odd shapes: one row, rows not a
multiple of the kernel's four, outputs not a multiple of anything. And against the default
float32 path: they differ by no more than the activations' rounding allows."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from quant_testlib import random_weight

from loragate.kernels.quant_dequant import dequantize
from loragate.kernels.quant_int8 import (
    AVX2,
    FORMATS,
    PORTABLE,
    VNNI,
    int8_paths,
    native_int8,
    takes_int8,
)
from loragate.kernels.quant_linear import quantized_linear

SHAPES = [(1, 37, 96), (5, 40, 256), (12, 3, 64)]


@pytest.fixture(scope="module")
def kernels():
    built = native_int8()
    assert built is not None, "quant_int8_cpu.c did not build"
    return built


def reference_rows(x: np.ndarray):
    blocks = x.reshape(x.shape[0], -1, 32)
    d = (np.abs(blocks).max(axis=2) / np.float32(127)).astype(np.float32)
    safe = np.where(d == 0, np.float32(1), d)
    q = np.where(d[..., None] == 0, 0, np.rint(blocks / safe[..., None])).astype(np.int8)
    return q.reshape(x.shape), d, q.astype(np.int32).sum(axis=2)


@pytest.mark.parametrize("path", int8_paths())
@pytest.mark.parametrize("name", sorted(FORMATS))
@pytest.mark.parametrize("m,n,k", SHAPES)
def test_int8_rows_times_blocks_equal_the_float64_reference(kernels, name, m, n, k, path):
    weight = random_weight(name, n, k, seed=m + n)
    assert takes_int8(weight)
    gen = torch.Generator().manual_seed(k + m)
    x = torch.randn(m, k, generator=gen)
    x[0, :32] = 0.0  # a block of zeros: scale 0, values 0
    bias = torch.randn(n, generator=gen)
    rows = kernels.quantize_rows(x)
    q, d, s = reference_rows(x.numpy())
    assert np.array_equal(rows.q.numpy(), q)
    assert np.array_equal(rows.d.numpy(), d)
    assert np.array_equal(rows.s.numpy(), s)
    out = torch.empty(m, n)
    kernels.linear(rows, weight, bias, out, path)
    w64 = dequantize(weight).double().numpy()
    x64 = (q.reshape(m, -1, 32) * d[..., None].astype(np.float64)).reshape(m, k)
    want = x64 @ w64.T + bias.double().numpy()
    bound = np.abs(x64) @ np.abs(w64).T + np.abs(bias.double().numpy())
    assert np.all(np.abs(out.double().numpy() - want) <= 2e-6 * bound + 1e-7)
    # Against the float32 activations: apart by at most each weight times half its block's
    # activation step (the rounding of x), plus float32's own sums.
    exact = quantized_linear(x, weight, bias)
    step = np.repeat(d, 32, axis=1).astype(np.float64) / 2
    allowed = step @ np.abs(w64).T
    assert np.all(np.abs(out.double().numpy() - exact.double().numpy()) <= allowed + 1e-5 * bound)


def test_each_simd_path_runs_where_the_cpu_has_it(kernels):
    """Each path this CPU runs is tested above; the paths are chosen from the flags."""
    assert kernels.has_simd_paths  # x86 with GCC: both SIMD paths are built
    vnni = frozenset({"avx2", "fma", "f16c", "avx512f", "avx512vl", "avx512_vnni"})
    assert int8_paths(vnni) == [PORTABLE, AVX2, VNNI]
    assert int8_paths(frozenset({"avx2", "fma", "f16c", "avx512f"})) == [PORTABLE, AVX2]
    assert int8_paths(frozenset({"avx2", "fma"})) == [PORTABLE]


def test_an_unknown_path_is_refused(kernels):
    weight = random_weight("Q4_0", 3, 64)
    rows = kernels.quantize_rows(torch.randn(1, 64))
    with pytest.raises(ValueError, match="refused"):
        kernels.linear(rows, weight, None, torch.empty(1, 3), path=3)


def test_other_formats_are_not_taken():
    assert not takes_int8(random_weight("Q4_K", 4, 256))
    assert not takes_int8(random_weight("I8_CH", 4, 64))
