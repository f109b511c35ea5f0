"""CUDA-only checks of the Triton kernels in half precision (skipped cleanly without a GPU);
plus a CPU check that the Triton kernels really run under the interpreter there."""

import math

import pytest
import torch
from kernel_reference import (
    CUDA,
    attention_reference,
    build_paged_cache,
    context_rows,
    lora_expand_reference,
    lora_shrink_reference,
    rel_error,
)

from loragate import kernels
from loragate.kernels import (
    decode_attention_triton,
    kv_cache,
    lora_triton,
    norm,
    prefill_attention_triton,
    quant_triton,
    rope,
)
from loragate.kernels.quant_blocks import FORMATS
from loragate.kernels.quant_dequant import dequantize

HALF = [torch.float16, torch.bfloat16]
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA device")


@pytest.mark.skipif(CUDA, reason="on a GPU the kernels compile for real")
def test_triton_runs_under_the_interpreter_without_cuda():
    """tests/conftest.py sets TRITON_INTERPRET=1 before the kernels are decorated."""
    kernels_in_use = [
        kv_cache._write_kv_kernel,
        decode_attention_triton._decode_kernel,
        decode_attention_triton._merge_kernel,
        prefill_attention_triton._prefill_kernel,
        lora_triton._shrink_kernel,
        lora_triton._expand_kernel,
        norm._norm_kernel,
        rope._rope_kernel,
        quant_triton._quant_matmul_kernel,
    ]
    for kernel in kernels_in_use:
        assert type(kernel).__name__ == "InterpretedFunction"


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("dtype", HALF)
def test_decode_and_prefill_half_precision(dtype):
    lens, heads, heads_kv, head_dim = [1, 17, 300, 1000], 9, 3, 64
    k_cache, v_cache, tables = build_paged_cache(lens, heads_kv, head_dim, 16, dtype, "cuda")
    seq_lens = torch.tensor(lens, dtype=torch.int32, device="cuda")
    scale = 1 / math.sqrt(head_dim)
    q = torch.randn(len(lens), heads, head_dim, dtype=dtype, device="cuda")
    out = kernels.paged_decode_attention(q, k_cache, v_cache, tables, seq_lens, scale)
    for b, n in enumerate(lens):
        keys, values = context_rows(k_cache, tables[b], n), context_rows(v_cache, tables[b], n)
        expected = attention_reference(q[b : b + 1], keys, values, scale, [n - 1])
        assert rel_error(out[b : b + 1], expected) < 2e-2
    q_lens = [1, 17, 100, 1000]
    starts = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    q = torch.randn(sum(q_lens), heads, head_dim, dtype=dtype, device="cuda")
    out = kernels.paged_prefill_attention(
        q, k_cache, v_cache, tables, seq_lens, starts.cuda(), scale
    )
    for b, (q_len, n) in enumerate(zip(q_lens, lens, strict=True)):
        rows = slice(int(starts[b]), int(starts[b + 1]))
        keys, values = context_rows(k_cache, tables[b], n), context_rows(v_cache, tables[b], n)
        expected = attention_reference(q[rows], keys, values, scale, list(range(n - q_len, n)))
        assert rel_error(out[rows], expected) < 2e-2


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("dtype", HALF)
def test_write_kv_and_lora_half_precision(dtype):
    k_cache = torch.randn(4, 16, 3, 64, dtype=dtype, device="cuda")
    v_cache = torch.randn_like(k_cache)
    key, value = torch.randn(2, 10, 3, 64, dtype=dtype, device="cuda")
    slots = torch.tensor([5, -1, 7, 8, 9, 60, 61, -1, 0, 1], device="cuda")
    kernels.write_kv(key, value, k_cache, v_cache, slots)
    flat_k = k_cache.view(64, 3, 64)
    assert torch.equal(flat_k[slots[slots >= 0]], key[slots >= 0])

    check_lora_stack([1, 8, 16, 64] * 8, 576, 1536, 64, 200, dtype, a_scale=1 / 24, tol=2e-2)


def _tolerance(dtype: torch.dtype) -> float:
    return 1e-4 if dtype == torch.float32 else 2e-2


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_attention_at_engine_scale(dtype):
    """64 sequences, contexts up to 8k tokens, 1B-class head layout (32 over 8 heads of 64)."""
    torch.manual_seed(1)
    lens = torch.randint(1, 8192, (64,)).tolist()
    lens[:3] = [1, 8191, 4096]
    heads, heads_kv, head_dim = 32, 8, 64
    k_cache, v_cache, tables = build_paged_cache(lens, heads_kv, head_dim, 16, dtype, "cuda")
    seq_lens = torch.tensor(lens, dtype=torch.int32, device="cuda")
    scale = 1 / math.sqrt(head_dim)
    q = torch.randn(len(lens), heads, head_dim, dtype=dtype, device="cuda")
    out = kernels.paged_decode_attention(q, k_cache, v_cache, tables, seq_lens, scale)
    for b, n in enumerate(lens):
        keys, values = context_rows(k_cache, tables[b], n), context_rows(v_cache, tables[b], n)
        expected = attention_reference(q[b : b + 1], keys, values, scale, [n - 1])
        assert rel_error(out[b : b + 1], expected) < _tolerance(dtype), f"sequence {b}"
    # Chunked prefill: the last q_len tokens of each of 8 long contexts.
    picks = [0, 1, 2, 5, 9, 17, 33, 63]
    q_lens = [
        min(lens[b], ql) for b, ql in zip(picks, [1, 2048, 512, 64, 7, 300, 1000, 16], strict=True)
    ]
    starts = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    q = torch.randn(sum(q_lens), heads, head_dim, dtype=dtype, device="cuda")
    out = kernels.paged_prefill_attention(
        q, k_cache, v_cache, tables[picks], seq_lens[picks], starts.cuda(), scale
    )
    for i, (b, q_len) in enumerate(zip(picks, q_lens, strict=True)):
        n = lens[b]
        rows = slice(int(starts[i]), int(starts[i + 1]))
        keys, values = context_rows(k_cache, tables[b], n), context_rows(v_cache, tables[b], n)
        expected = attention_reference(q[rows], keys, values, scale, list(range(n - q_len, n)))
        assert rel_error(out[rows], expected) < _tolerance(dtype), f"sequence {b}"


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tokens", [1, 64, 1024])
def test_lora_at_engine_scale(dtype, tokens):
    """64 adapters of ranks 8-64 on a 1B-class projection (2048 -> 8192), base rows mixed in."""
    torch.manual_seed(tokens)
    check_lora_stack(
        [8, 16, 32, 64] * 16, 2048, 8192, 64, tokens, dtype, a_scale=1 / 45, tol=_tolerance(dtype)
    )


def check_lora_stack(ranks, d_in, d_out, max_rank, tokens, dtype, a_scale, tol, device="cuda"):
    """Shrink and expand over one slot per rank in `ranks`, base rows (-1) mixed in, against
    the float64 references; base rows' outputs stay untouched."""
    lora_a = torch.zeros(len(ranks), max_rank, d_in, dtype=dtype, device=device)
    lora_b = torch.zeros(len(ranks), d_out, max_rank, dtype=dtype, device=device)
    for slot, rank in enumerate(ranks):
        lora_a[slot, :rank] = torch.randn(rank, d_in, dtype=dtype, device=device) * a_scale
        lora_b[slot, :, :rank] = torch.randn(d_out, rank, dtype=dtype, device=device) / 8
    slot_ids = torch.randint(-1, len(ranks), (tokens,), device=device)
    x = torch.randn(tokens, d_in, dtype=dtype, device=device)
    scales = torch.rand(len(ranks), device=device)
    y = kernels.lora_shrink(x, lora_a, slot_ids)
    assert rel_error(y, lora_shrink_reference(x, lora_a, slot_ids)) < tol
    out = torch.randn(tokens, d_out, dtype=dtype, device=device)
    before = out.clone()
    kernels.lora_expand(y, lora_b, slot_ids, scales, out)
    expected = lora_expand_reference(y, lora_b, slot_ids, scales, before)
    if (slot_ids >= 0).any():
        assert rel_error(out - before, expected - before.double().cpu()) < tol
    assert torch.equal(out[slot_ids < 0], before[slot_ids < 0])


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("name", list(FORMATS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_quantized_products_on_cuda(name, dtype):
    """The Triton product with block-format weights compiled for the card: float32 exact up
    to summation order (no TF32), bfloat16 within its rounding, at decode and prefill rows."""
    from quant_testlib import random_weight

    size = FORMATS[name].block_size
    weight = random_weight(name, 300, size * (2048 // size), seed=3)
    weight = type(weight)(weight.blocks.cuda(), name, weight.out_features, weight.in_features)
    dense = dequantize(weight).double()
    for rows in (1, 7, 300):
        x = torch.randn(rows, weight.in_features, device="cuda")
        got = kernels.linear(x.to(dtype), weight)
        assert got.dtype == dtype
        expected = x.to(dtype).double() @ dense.T
        assert rel_error(got.double(), expected) < (1e-5 if dtype == torch.float32 else 2e-2)
