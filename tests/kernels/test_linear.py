"""Packed linear weights (kernels/linear.py): the same products as F.linear, to float32
rounding, held to a float64 reference at the model's shapes and at odd ones."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from loragate import kernels
from loragate.engine.loading.cpu_features import NATIVE_BF16_FLAGS, cpu_flags
from loragate.kernels.linear import DISABLE_ENV, packing_available

needs_onednn = pytest.mark.skipif(
    not torch.backends.mkldnn.is_available(), reason="this torch build has no oneDNN"
)

SHAPES = [(960, 576), (3072, 576), (576, 1536), (49152, 576), (37, 19), (5, 130)]


@needs_onednn
@pytest.mark.parametrize("out_features,in_features", SHAPES)
@pytest.mark.parametrize("tokens", [1, 7, 64, 301])
def test_packed_weight_matches_a_float64_reference(out_features, in_features, tokens):
    gen = torch.Generator().manual_seed(out_features * 7 + tokens)
    weight = torch.randn(out_features, in_features, generator=gen) * in_features**-0.5
    bias = torch.randn(out_features, generator=gen)
    x = torch.randn(tokens, in_features, generator=gen)
    packed = kernels.pack_weight(weight)
    assert isinstance(packed, kernels.PackedWeight), "float32 CPU weights are packed"
    x64, weight64 = x.double(), weight.double()
    # float32 rounding of a length-K sum: about sqrt(K) units of the last place of the sum
    # of |x_k w_k| (a wrong index or a dropped block is off by far more); the same bound
    # with and without the bias, computed once
    magnitude = x64.abs() @ weight64.abs().T
    bound = 4 * in_features**0.5 * 2**-24 * magnitude + 1e-6
    for b in (None, bias):
        got = kernels.linear(x, packed, b)
        reference = F.linear(x64, weight64, None if b is None else b.double())
        assert got.dtype == torch.float32 and got.shape == (tokens, out_features)
        excess = ((got - reference).abs() - bound).max()
        assert excess <= 0, f"off by {excess.item():.3g} beyond float32 rounding"


@pytest.mark.skipif(
    not (torch.backends.mkldnn.is_available() and set(NATIVE_BF16_FLAGS) & cpu_flags()),
    reason="bf16 weights are packed only on CPUs with native bf16 (AVX512-BF16 or AMX)",
)
@pytest.mark.parametrize("out_features,in_features", SHAPES)
@pytest.mark.parametrize("tokens", [1, 7, 64])
def test_packed_bf16_weight_matches_a_float64_reference(out_features, in_features, tokens):
    gen = torch.Generator().manual_seed(out_features * 5 + tokens)
    weight = (torch.randn(out_features, in_features, generator=gen) * in_features**-0.5).bfloat16()
    x = torch.randn(tokens, in_features, generator=gen).bfloat16()
    packed = kernels.pack_weight(weight, native_bf16=True)
    assert isinstance(packed, kernels.PackedWeight), "bf16 weights are packed where native"
    got = kernels.linear(x, packed)
    assert got.dtype == torch.bfloat16 and got.shape == (tokens, out_features)
    reference = F.linear(x.double(), weight.double())
    # float32 sums of exact bf16 products, then one rounding to bf16 (8 significant bits)
    magnitude = x.double().abs() @ weight.double().abs().T
    bound = 2**-8 * reference.abs() + 4 * in_features**0.5 * 2**-24 * magnitude + 1e-6
    excess = ((got.double() - reference).abs() - bound).max()
    assert excess <= 0, f"off by {excess.item():.3g} beyond bf16 rounding"


@needs_onednn
def test_packed_weight_takes_no_rows_and_strided_rows():
    weight = torch.randn(48, 32)
    packed = kernels.pack_weight(weight)
    assert kernels.linear(torch.empty(0, 32), packed).shape == (0, 48)
    wide = torch.randn(5, 64)
    strided = wide[:, ::2]  # not contiguous
    torch.testing.assert_close(kernels.linear(strided, packed), F.linear(strided, weight))


def test_weights_that_gain_nothing_stay_plain(monkeypatch):
    bf16 = torch.randn(16, 16, dtype=torch.bfloat16)
    assert kernels.pack_weight(bf16) is bf16
    assert not packing_available(torch.device("cuda"), torch.float32)
    monkeypatch.setenv(DISABLE_ENV, "0")
    weight = torch.randn(16, 16)
    assert kernels.pack_weight(weight) is weight
    x = torch.randn(3, 16)
    assert torch.equal(kernels.linear(x, weight), F.linear(x, weight))


def test_a_bad_setting_is_named(monkeypatch):
    monkeypatch.setenv(DISABLE_ENV, "yes")
    with pytest.raises(ValueError, match=DISABLE_ENV):
        kernels.pack_weight(torch.randn(4, 4))
