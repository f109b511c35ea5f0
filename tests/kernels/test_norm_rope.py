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


@pytest.mark.parametrize("dtype,tolerance", [(torch.float32, 1e-5), (torch.bfloat16, 1e-2)])
@pytest.mark.parametrize("heads,heads_kv,head_dim", [(9, 3, 64), (4, 4, 128), (2, 1, 10)])
def test_rope_in_place_on_q_and_k_of_fused_qkv(dtype, tolerance, heads, heads_kv, head_dim):
    """apply_rope_ (native on this CPU, torch elsewhere) rotates q and k heads of a fused qkv
    row in place by table rows picked by position, leaving v alone."""
    tokens, rotated = 13, heads + heads_kv
    qkv = torch.randn(tokens, (rotated + heads_kv) * head_dim).to(dtype)
    positions = torch.randint(0, 300, (tokens,))
    inv_freq = 1.0 / (100000 ** (torch.arange(0, head_dim, 2).double() / head_dim))
    freqs = torch.arange(300).double()[:, None] * inv_freq[None]
    emb = torch.cat((freqs, freqs), dim=-1)
    table = torch.cat((emb.cos(), emb.sin()), dim=-1).to(dtype)
    before = qkv.clone()
    view = qkv[:, : rotated * head_dim].view(tokens, rotated, head_dim)
    kernels.apply_rope_(view, table, positions)
    cos, sin = table[positions].chunk(2, dim=-1)
    expected = rope_reference(
        before[:, : rotated * head_dim].view(tokens, rotated, head_dim), cos, sin
    )
    assert rel_error(view, expected) < tolerance
    assert torch.equal(qkv[:, rotated * head_dim :], before[:, rotated * head_dim :])
    from loragate.kernels import rope

    torch_path = before.clone()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(rope, "native_norm_rope", lambda: None)
        kernels.apply_rope_(
            torch_path[:, : rotated * head_dim].view(tokens, rotated, head_dim), table, positions
        )
    assert (
        rel_error(torch_path[:, : rotated * head_dim].view(tokens, rotated, head_dim), expected)
        < tolerance
    )


@pytest.mark.parametrize("hidden", [576, 100])
def test_bfloat16_norm_matches_torch_version(hidden):
    """The native bf16 norm rounds where the torch version does (the summed residual, the
    normalised row, the weighted product), so it equals it up to the float32 sum's order."""
    from loragate.kernels import norm

    x, residual = torch.randn(2, 13, hidden).to(torch.bfloat16)
    weight = torch.randn(hidden).to(torch.bfloat16)
    normed, summed = kernels.add_rms_norm(x, residual, weight, 1e-5)
    assert torch.equal(summed, x + residual)
    reference = norm._norm_torch(x + residual, weight, 1e-5)
    assert rel_error(normed, reference) < 1e-2
    assert rel_error(normed, rms_norm_reference(x + residual, weight, 1e-5)) < 1e-2
    assert rel_error(kernels.rms_norm(x, weight, 1e-5), norm._norm_torch(x, weight, 1e-5)) < 1e-2


def test_without_a_compiler_norm_and_rope_run_torch_and_say_why(monkeypatch, tmp_path):
    from loragate.kernels import _native, norm_rope_cpu

    library = _native.Loaded(norm_rope_cpu._library.source, norm_rope_cpu.NativeNormRope)
    monkeypatch.setattr(norm_rope_cpu, "_library", library)
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    monkeypatch.setenv("LORAGATE_CACHE", str(tmp_path))
    x, residual = torch.randn(2, 5, 64)
    weight = torch.randn(64)
    normed, summed = kernels.add_rms_norm(x, residual, weight, 1e-5)
    assert "no-such-compiler" in norm_rope_cpu.native_norm_rope_error()
    assert rel_error(normed, rms_norm_reference(x + residual, weight, 1e-5)) < 1e-5
    qk = torch.randn(5, 3, 64)
    table = torch.randn(10, 128)
    positions = torch.tensor([0, 3, 9, 1, 1])
    expected = rope_reference(qk, *table[positions].chunk(2, dim=-1))
    kernels.apply_rope_(qk, table, positions)
    assert rel_error(qk, expected) < 1e-5
