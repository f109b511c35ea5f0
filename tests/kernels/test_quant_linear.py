"""Block-format weights (kernels/quant_*.py): the torch dequantizer gives the `gguf`
package's values bit for bit; the native vector and scalar paths give the same values, and
products equal to a float64 reference up to float32 summation rounding, on odd shapes."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf.quants import dequantize as gguf_dequantize
from gguf.quants import quantize as gguf_quantize
from quant_testlib import INT_RANGE, int_reference, random_blocks, random_weight

from loragate import kernels
from loragate.kernels import quant_cpu, quant_linear
from loragate.kernels.quant_blocks import (
    FORMATS,
    GGUF_TYPES,
    QuantizedWeight,
    StackedWeights,
    stack_rows,
)
from loragate.kernels.quant_dequant import dequantize

NAMES = list(FORMATS)
# Each native path this CPU runs (its flags, read at run time): AVX-512 where it has it.
CODES = {"scalar": quant_cpu.SCALAR, "vector": quant_cpu.VECTOR, "avx512": quant_cpu.AVX512}
PATHS = [name for name, code in CODES.items() if code in quant_cpu.cpu_paths()]
QUANTIZABLE = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"]  # what gguf-py can quantize itself


def in_features_of(name: str) -> int:
    return FORMATS[name].block_size * 3


@pytest.fixture(scope="module")
def native():
    loaded = quant_cpu.native_quant()
    assert loaded is not None, quant_cpu.native_quant_error()
    return loaded


@pytest.fixture(params=PATHS)
def path(request, monkeypatch):
    """Runs the test on one native path: AVX-512, the 8-lane vector one (AVX2/FMA) or the
    scalar."""
    code = CODES[request.param]
    monkeypatch.setattr(quant_linear, "vector_path", lambda: code)
    return code


@pytest.mark.parametrize("name", GGUF_TYPES)
def test_torch_dequantizer_matches_gguf_bit_for_bit(name):
    blocks = random_blocks(name, 5, in_features_of(name), seed=1)
    expected = gguf_dequantize(blocks, getattr(gguf.GGMLQuantizationType, name))
    got = dequantize(QuantizedWeight.of(torch.from_numpy(blocks), name, in_features_of(name)))
    assert np.array_equal(got.numpy().view(np.uint32), expected.view(np.uint32))


@pytest.mark.parametrize("name", list(INT_RANGE))
def test_integer_formats_dequantize_to_the_float64_reference_rounded_once(name):
    """d times an integer (I8_CH) or d times (q - z) (I4_G*): one float32 rounding of the
    exact product, which float64 holds exactly."""
    blocks = random_blocks(name, 5, in_features_of(name), seed=11)
    expected = int_reference(blocks, name, in_features_of(name)).astype(np.float32)
    got = dequantize(QuantizedWeight.of(torch.from_numpy(blocks), name, in_features_of(name)))
    assert np.array_equal(got.numpy().view(np.uint32), expected.view(np.uint32))


@pytest.mark.parametrize("name", QUANTIZABLE)
def test_gguf_quantized_floats_dequantize_as_gguf_does(name):
    qtype = getattr(gguf.GGMLQuantizationType, name)
    floats = np.random.default_rng(2).standard_normal((3, 64)).astype(np.float32)
    blocks = gguf_quantize(floats, qtype)
    got = dequantize(QuantizedWeight.of(torch.from_numpy(blocks), name, 64))
    assert torch.equal(got, torch.from_numpy(gguf_dequantize(blocks, qtype)))
    assert (got - torch.from_numpy(floats)).abs().max() < 0.3  # and near what was quantized


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("vector", [CODES[p] for p in PATHS], ids=PATHS)
def test_native_dequantizer_gives_the_same_values(native, name, vector):
    weight = random_weight(name, 7, in_features_of(name), seed=3)
    out = torch.full((7, weight.in_features), float("nan"))
    native.dequantize(weight, out, vector)
    assert torch.equal(out, dequantize(weight))


def assert_float32_rounding(got, x, weight_f, bias=None):
    """got within float32 rounding of a length-K sum (about sqrt(K) last places of the sum
    of |x_k w_k|) of the float64 product; a wrong index or a dropped block is far more."""
    reference = F.linear(x.double(), weight_f.double(), None if bias is None else bias.double())
    magnitude = x.double().abs() @ weight_f.double().abs().T
    if bias is not None:
        magnitude = magnitude + bias.double().abs()
    bound = 4 * x.shape[1] ** 0.5 * 2**-24 * magnitude + 1e-6
    assert not torch.isnan(got).any()
    excess = ((got.double() - reference).abs() - bound).max()
    assert excess <= 0, f"off by {excess.item():.3g} beyond float32 rounding"


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("rows", [1, 3, 5, 13, 64, 130])
def test_products_match_a_float64_reference(name, rows, path):
    """Rows: one, fewer than the kernel's group of 4, not a multiple of it, past the panel
    threshold (native panels), past the torch panels' threshold; 37 outputs (odd, and not a
    multiple of any panel or of the native panels' three outputs)."""
    weight = random_weight(name, 37, in_features_of(name), seed=rows)
    gen = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, weight.in_features, generator=gen)
    bias = torch.randn(37, generator=gen)
    for b in (None, bias):
        got = quant_linear.quantized_linear(x, weight, b)
        assert got.shape == (rows, 37) and got.dtype == torch.float32
        assert_float32_rounding(got, x, dequantize(weight), b)


@pytest.mark.parametrize("name", ["Q4_1", "Q6_K"])
def test_strided_activations_and_panels_of_many_outputs(name, path, monkeypatch):
    """x a column slice of a wider tensor; both panel paths over several panels."""
    monkeypatch.setattr(quant_linear, "PANEL_BYTES", 4 * in_features_of(name) * 16)
    monkeypatch.setattr(quant_linear, "NATIVE_PANEL_BYTES", 4 * in_features_of(name) * 12)
    weight = random_weight(name, 75, in_features_of(name), seed=9)
    wide = torch.randn(140, weight.in_features + 8)
    x = wide[:, 3 : 3 + weight.in_features]
    for rows in (2, 40, 140):
        got = quant_linear.quantized_linear(x[:rows], weight)
        assert_float32_rounding(got, x[:rows], dequantize(weight))


@pytest.mark.parametrize("name", ["Q8_0", "Q4_K"])
def test_the_torch_path_and_kernels_linear_dispatch(name):
    weight = random_weight(name, 19, in_features_of(name), seed=4)
    x = torch.randn(6, weight.in_features)
    for got in (quant_linear.quantized_linear(x, weight, native=False), kernels.linear(x, weight)):
        assert_float32_rounding(got, x, dequantize(weight))


def test_bfloat16_activations_come_back_in_bfloat16():
    weight = random_weight("Q4_0", 8, 64, seed=5)
    x = torch.randn(3, 64).bfloat16()
    got = kernels.linear(x, weight)
    assert got.dtype == torch.bfloat16
    expected = F.linear(x.float(), dequantize(weight)).bfloat16()
    assert torch.allclose(got.float(), expected.float(), rtol=1e-2, atol=1e-3)


def test_stacked_rows_of_mixed_formats_fill_their_own_columns(path):
    """A fused projection whose parts differ in type (Q4_K_M files): each part's columns."""
    parts = [random_weight("Q4_K", 16, 256, 6), random_weight("Q6_K", 8, 256, 7)]
    plain = torch.randn(4, 256)
    same = stack_rows([parts[0], random_weight("Q4_K", 3, 256, 8)])
    assert isinstance(same, QuantizedWeight) and same.shape == (19, 256)
    stacked = stack_rows([*parts, plain])
    assert isinstance(stacked, StackedWeights) and stacked.shape == (28, 256)
    x = torch.randn(5, 256)
    full = torch.cat([dequantize(parts[0]), dequantize(parts[1]), plain])
    bias = torch.randn(28)
    assert_float32_rounding(kernels.linear(x, stacked, bias), x, full, bias)


@pytest.mark.parametrize("name", NAMES)
def test_embedding_rows_dequantize_only_the_rows_looked_up(name, path):
    weight = random_weight(name, 11, in_features_of(name), seed=10)
    ids = torch.tensor([[3, 0], [10, 3]])
    got = quant_linear.dequantized_rows(weight, ids)
    assert torch.equal(got, dequantize(weight)[ids.reshape(-1)])


def test_bad_shapes_are_refused_naming_the_format():
    with pytest.raises(ValueError, match="multiple of 256"):
        QuantizedWeight.of(torch.zeros(144, dtype=torch.uint8), "Q4_K", 200)
    with pytest.raises(ValueError, match="Q8_0 blocks"):
        QuantizedWeight(torch.zeros(2, 33, dtype=torch.uint8), "Q8_0", 2, 32)
    with pytest.raises(ValueError, match="'IQ2_XS' is not supported"):
        QuantizedWeight.of(torch.zeros(2, 10, dtype=torch.uint8), "IQ2_XS", 32)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("rows", [1, 5, 17])
def test_the_triton_product_matches_a_float64_reference(name, rows):
    """kernels/quant_triton.py under the interpreter (CUDA compiles the same kernel): every
    format, one row, a partial tile and more rows than one tile holds; 70 outputs (two
    column tiles, the second partial); with and without a bias."""
    weight = random_weight(name, 70, in_features_of(name), seed=20 + rows)
    gen = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, weight.in_features, generator=gen)
    bias = torch.randn(70, generator=gen)
    for b in (None, bias):
        got = quant_linear.quantized_linear(x, weight, b, backend="triton")
        assert got.shape == (rows, 70) and got.dtype == torch.float32
        assert_float32_rounding(got, x, dequantize(weight), b)


@pytest.mark.parametrize("name", ["Q5_K", "I4_G128"])
def test_the_triton_product_takes_strided_rows_and_half_activations(name):
    """Every other row of a wider weight (a gathered or sliced view), x a column slice, and
    float16 activations multiplying the weights rounded to float16 (bfloat16 on a GPU only:
    the interpreter has no bfloat16 arithmetic; tests/kernels/test_gpu.py checks it there)."""
    whole = random_weight(name, 40, in_features_of(name), seed=30)
    weight = QuantizedWeight(whole.blocks[::2], name, 20, whole.in_features)
    wide = torch.randn(6, weight.in_features + 5)
    x = wide[:, 2 : 2 + weight.in_features]
    got = quant_linear.quantized_linear(x, weight, backend="triton")
    assert_float32_rounding(got, x, dequantize(weight))
    half = quant_linear.quantized_linear(x.half(), weight, backend="triton")
    assert half.dtype == torch.float16
    expected = F.linear(x.half().float(), dequantize(weight).half().float())
    assert torch.allclose(half.float(), expected, rtol=4e-3, atol=4e-3)


def test_the_triton_product_refuses_bad_inputs():
    weight = random_weight("Q8_0", 4, 64, seed=31)
    with pytest.raises(ValueError, match=r"x must be \[rows, 64\]"):
        quant_linear.quantized_linear(torch.zeros(2, 32), weight, backend="triton")
    with pytest.raises(ValueError, match="float32, bfloat16 or float16"):
        quant_linear.quantized_linear(
            torch.zeros(2, 64, dtype=torch.float64), weight, backend="triton"
        )
