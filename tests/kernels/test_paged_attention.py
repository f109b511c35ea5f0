"""Paged decode and prefill attention against a float64 reference over the same contexts.

The caches hold NaN in every slot that is not part of a context and the block tables hold an
out-of-range id past each sequence's blocks, so a kernel that reads beyond a context fails.
"""

import math

import pytest
import torch
from kernel_reference import (
    BACKENDS,
    CUDA,
    attention_reference,
    build_paged_cache,
    context_rows,
    rel_error,
)

from loragate import kernels

HEADS = [(4, 4), (6, 2), (8, 2)]  # GQA ratios 1, 3 and 4
DECODE_LENS = [1, 15, 16, 17, 33, 70]
# (new tokens, context length): plain prefills around block edges, a cached prefix, a chunk
# of a chunked prefill, a decode token riding in a mixed batch, and a sequence with no query.
PREFILL_SHAPES = [(1, 1), (15, 15), (16, 16), (17, 17), (5, 40), (20, 50), (1, 23), (0, 9)]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("heads,heads_kv", HEADS)
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("block_size", [16, 32])
def test_decode_matches_reference(backend, heads, heads_kv, head_dim, block_size):
    k_cache, v_cache, tables = build_paged_cache(DECODE_LENS, heads_kv, head_dim, block_size)
    seq_lens = torch.tensor(DECODE_LENS, dtype=torch.int32)
    q = torch.randn(len(DECODE_LENS), heads, head_dim)
    scale = 1 / math.sqrt(head_dim)
    out = kernels.paged_decode_attention(q, k_cache, v_cache, tables, seq_lens, scale, backend)
    assert out.shape == q.shape and out.dtype == q.dtype
    for b, n in enumerate(DECODE_LENS):
        keys = context_rows(k_cache, tables[b], n)
        values = context_rows(v_cache, tables[b], n)
        expected = attention_reference(q[b : b + 1], keys, values, scale, [n - 1])
        assert rel_error(out[b : b + 1], expected) < 1e-4, f"sequence {b} (length {n})"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("heads,heads_kv", HEADS)
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("block_size", [16, 32])
def test_prefill_matches_reference(backend, heads, heads_kv, head_dim, block_size):
    q_lens = [q_len for q_len, _ in PREFILL_SHAPES]
    contexts = [context for _, context in PREFILL_SHAPES]
    k_cache, v_cache, tables = build_paged_cache(contexts, heads_kv, head_dim, block_size)
    starts = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    q = torch.randn(sum(q_lens), heads, head_dim)
    scale = 1 / math.sqrt(head_dim)
    out = kernels.paged_prefill_attention(
        q,
        k_cache,
        v_cache,
        tables,
        torch.tensor(contexts, dtype=torch.int32),
        starts,
        scale,
        backend=backend,
    )
    assert out.shape == q.shape and out.dtype == q.dtype
    for b, (q_len, context) in enumerate(PREFILL_SHAPES):
        if q_len == 0:
            continue
        rows = slice(int(starts[b]), int(starts[b + 1]))
        keys = context_rows(k_cache, tables[b], context)
        values = context_rows(v_cache, tables[b], context)
        positions = list(range(context - q_len, context))
        expected = attention_reference(q[rows], keys, values, scale, positions)
        assert rel_error(out[rows], expected) < 1e-4, f"sequence {b} ({q_len} of {context})"


@pytest.mark.parametrize("backend", BACKENDS)
def test_prefill_of_single_tokens_equals_decode(backend):
    """A batch of one-token queries through prefill gives what decode gives."""
    lens = [3, 16, 17, 40]
    k_cache, v_cache, tables = build_paged_cache(lens, 2, 64, 16)
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    q = torch.randn(len(lens), 6, 64)
    starts = torch.arange(len(lens) + 1, dtype=torch.int32)
    prefill = kernels.paged_prefill_attention(
        q, k_cache, v_cache, tables, seq_lens, starts, 0.125, backend=backend
    )
    decode = kernels.paged_decode_attention(q, k_cache, v_cache, tables, seq_lens, 0.125, backend)
    assert rel_error(prefill, decode) < 1e-5


def test_default_backend_on_cpu_is_torch():
    assert kernels._backend.resolve_backend(None, torch.zeros(1)) == "torch"


def test_attention_rejects_bad_inputs():
    k_cache, v_cache, tables = build_paged_cache([5], 2, 64, 16)
    seq_lens = torch.tensor([5], dtype=torch.int32)
    with pytest.raises(ValueError, match="multiple of KV heads"):
        kernels.paged_decode_attention(torch.randn(1, 3, 64), k_cache, v_cache, tables, seq_lens, 1)
    with pytest.raises(ValueError, match="head_dim"):
        kernels.paged_decode_attention(torch.randn(1, 4, 32), k_cache, v_cache, tables, seq_lens, 1)
    with pytest.raises(ValueError, match="unknown kernel backend"):
        kernels.paged_decode_attention(
            torch.randn(1, 4, 64), k_cache, v_cache, tables, seq_lens, 1, backend="cuda"
        )
    for backend in BACKENDS:
        device = "cuda" if CUDA and backend == "triton" else "cpu"
        caches = [t.to(device) for t in (k_cache, v_cache, tables, seq_lens)]
        too_many = torch.tensor([0, 6], dtype=torch.int32, device=device)
        q = torch.randn(6, 4, 64, device=device)
        with pytest.raises(ValueError, match="6 new tokens but a context of only 5"):
            kernels.paged_prefill_attention(q, *caches, too_many, 1, backend)
    with pytest.raises(ValueError, match="query_start_loc must be"):
        kernels.paged_prefill_attention(
            torch.randn(5, 4, 64), k_cache, v_cache, tables, seq_lens, torch.tensor([0]), 1
        )


@pytest.mark.parametrize("backend", BACKENDS)
def test_attention_over_interleaved_caches(backend):
    """Caches that are views of one [blocks, 2, block_size, H_kv, D] allocation."""
    lens = [1, 17, 40]
    k_cache, v_cache, tables = build_paged_cache(lens, 2, 64, 16)
    storage = torch.stack([k_cache, v_cache], dim=1)
    k_view, v_view = storage[:, 0], storage[:, 1]
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    q = torch.randn(len(lens), 8, 64)
    out = kernels.paged_decode_attention(q, k_view, v_view, tables, seq_lens, 0.125, backend)
    expected = kernels.paged_decode_attention(q, k_cache, v_cache, tables, seq_lens, 0.125, "torch")
    assert rel_error(out, expected) < 1e-5
    starts = torch.tensor([0, 1, 4, 44], dtype=torch.int32)
    q = torch.randn(44, 8, 64)
    args = (tables, seq_lens, starts, 0.125)
    out = kernels.paged_prefill_attention(q, k_view, v_view, *args, backend=backend)
    expected = kernels.paged_prefill_attention(q, k_cache, v_cache, *args, backend="torch")
    assert rel_error(out, expected) < 1e-5


@pytest.mark.parametrize("partition_size", [32, 48, 64])
def test_triton_decode_split_context_matches_reference(partition_size):
    """FlashDecoding path: contexts split into partitions merged by a second kernel, including
    partitions that lie wholly past a short sequence's end."""
    from loragate.kernels.decode_attention_triton import decode_triton

    torch.set_default_device("cuda" if CUDA else "cpu")  # the fixture resets it
    lens = [1, 31, 32, 33, 100]
    k_cache, v_cache, tables = build_paged_cache(lens, 2, 64, 16)
    q = torch.randn(len(lens), 6, 64)
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    out = decode_triton(q, k_cache, v_cache, tables, seq_lens, 0.125, partition_size)
    for b, n in enumerate(lens):
        keys, values = context_rows(k_cache, tables[b], n), context_rows(v_cache, tables[b], n)
        expected = attention_reference(q[b : b + 1], keys, values, 0.125, [n - 1])
        assert rel_error(out[b : b + 1], expected) < 1e-4, f"sequence {b} (length {n})"
