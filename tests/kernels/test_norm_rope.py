"""Fused RMSNorm (+ residual add) and rotary embedding against float64 references."""

import pytest
import torch
from kernel_reference import BACKENDS, CUDA, rel_error

from loragate import kernels


def rms_norm_reference(x, weight, eps):
    x = x.double()
    return weight.double() * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def rope_reference(x, cos, sin):
    x, cos, sin = x.double(), cos.double()[:, None], sin.double()[:, None]
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def rope_tables(tokens, head_dim):
    positions = torch.randint(0, 4096, (tokens,)).double()
    inv_freq = 1.0 / (100000 ** (torch.arange(0, head_dim, 2).double() / head_dim))
    freqs = positions[:, None] * inv_freq[None]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().float(), emb.sin().float()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("hidden", [576, 100])
def test_rms_norm_and_fused_residual(backend, hidden):
    x, residual = torch.randn(2, 13, hidden)
    weight = torch.randn(hidden)
    out = kernels.rms_norm(x, weight, 1e-5, backend=backend)
    assert rel_error(out, rms_norm_reference(x, weight, 1e-5)) < 1e-4
    normed, summed = kernels.add_rms_norm(x, residual, weight, 1e-5, backend=backend)
    assert torch.equal(summed, x + residual)
    assert rel_error(normed, rms_norm_reference(x + residual, weight, 1e-5)) < 1e-4


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("heads,head_dim", [(9, 64), (3, 128), (2, 10)])
def test_rope_on_a_slice_of_fused_qkv(backend, heads, head_dim):
    tokens = 11
    qkv = torch.randn(tokens, (heads + 2) * head_dim)
    q = qkv[:, : heads * head_dim].view(tokens, heads, head_dim)
    cos, sin = rope_tables(tokens, head_dim)
    out = kernels.apply_rope(q, cos, sin, backend=backend)
    assert out.shape == q.shape
    assert rel_error(out, rope_reference(q, cos, sin)) < 1e-4


def test_norm_and_rope_reject_bad_shapes():
    with pytest.raises(ValueError, match="weight must be"):
        kernels.rms_norm(torch.randn(3, 8), torch.ones(7), 1e-5)
    with pytest.raises(ValueError, match="residual shape"):
        kernels.add_rms_norm(torch.randn(3, 8), torch.randn(2, 8), torch.ones(8), 1e-5)
    with pytest.raises(ValueError, match="cos and sin"):
        kernels.apply_rope(torch.randn(3, 2, 8), torch.randn(3, 4), torch.randn(3, 4))


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_norm_and_rope_half_precision(dtype):
    x, residual = torch.randn(2, 64, 576, dtype=dtype, device="cuda")
    weight = torch.randn(576, dtype=dtype, device="cuda")
    normed, summed = kernels.add_rms_norm(x, residual, weight, 1e-5)
    expected = rms_norm_reference((x.double() + residual.double()).cpu(), weight.cpu(), 1e-5)
    assert rel_error(normed, expected) < 2e-2
    q = torch.randn(64, 9, 64, dtype=dtype, device="cuda")
    cos, sin = (t.to(dtype).cuda() for t in rope_tables(64, 64))
    assert (
        rel_error(kernels.apply_rope(q, cos, sin), rope_reference(q.cpu(), cos.cpu(), sin.cpu()))
        < 2e-2
    )
