"""Sliding-window and head_dim-256 paged attention (Gemma 3's local layers, Mistral's window,
Gemma's 256-wide heads) against the float64 reference, on the torch reference, the native CPU
kernel and the Triton kernels (under the interpreter on a CPU).

Every cache block wholly before a sequence's window is poisoned with NaN after the context is
written, so a kernel that reads a block it should skip fails, besides one that attends a key
out of the window (the reference drops those keys).
"""

import math

import pytest
import torch
from kernel_reference import (
    BACKENDS,
    attention_reference,
    build_paged_cache,
    context_rows,
    rel_error,
)

from loragate import kernels
from loragate.kernels import attention_cpu, decode_attention, prefill_attention

DECODE_LENS = [1, 7, 8, 9, 16, 17, 40, 70]
# (new tokens, context): prompts longer than the window, chunks starting past it, short runs
# (the native path), a decode token riding in a mixed batch, a sequence with no query.
PREFILL_SHAPES = [(1, 1), (12, 12), (30, 30), (5, 40), (20, 50), (1, 23), (3, 9), (0, 9)]


def poison_before_windows(k_cache, v_cache, tables, first_needed, block_size):
    """NaN into every block that lies wholly before position first_needed[b] of sequence b."""
    for b, first in enumerate(first_needed):
        for i in range(first // block_size):
            block = int(tables[b, i])
            k_cache[block] = float("nan")
            v_cache[block] = float("nan")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("window", [1, 8, 16, 33])
@pytest.mark.parametrize("heads,heads_kv,head_dim", [(4, 2, 64), (2, 1, 256), (8, 4, 256)])
def test_windowed_decode_matches_reference(backend, window, heads, heads_kv, head_dim):
    torch.manual_seed(window * 10 + head_dim)
    block_size = 8
    k_cache, v_cache, tables = build_paged_cache(DECODE_LENS, heads_kv, head_dim, block_size)
    expected = []
    q = torch.randn(len(DECODE_LENS), heads, head_dim)
    scale = 1 / math.sqrt(head_dim)
    for b, n in enumerate(DECODE_LENS):
        keys = context_rows(k_cache, tables[b], n)
        values = context_rows(v_cache, tables[b], n)
        expected.append(attention_reference(q[b : b + 1], keys, values, scale, [n - 1], window))
    poison_before_windows(
        k_cache, v_cache, tables, [max(0, n - window) for n in DECODE_LENS], block_size
    )
    seq_lens = torch.tensor(DECODE_LENS, dtype=torch.int32)
    out = kernels.paged_decode_attention(
        q, k_cache, v_cache, tables, seq_lens, scale, backend, window=window
    )
    assert out.shape == q.shape
    for b, n in enumerate(DECODE_LENS):
        assert rel_error(out[b : b + 1], expected[b]) < 1e-4, f"sequence {b} (length {n})"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("window", [1, 8, 13])
@pytest.mark.parametrize("heads,heads_kv,head_dim", [(4, 2, 64), (2, 1, 256)])
def test_windowed_prefill_matches_reference(backend, window, heads, heads_kv, head_dim):
    torch.manual_seed(window * 7 + head_dim)
    block_size = 8
    q_lens = [q_len for q_len, _ in PREFILL_SHAPES]
    contexts = [context for _, context in PREFILL_SHAPES]
    k_cache, v_cache, tables = build_paged_cache(contexts, heads_kv, head_dim, block_size)
    starts = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    q = torch.randn(sum(q_lens), heads, head_dim)
    scale = 1 / math.sqrt(head_dim)
    expected = {}
    for b, (q_len, context) in enumerate(PREFILL_SHAPES):
        if q_len == 0:
            continue
        rows = slice(int(starts[b]), int(starts[b + 1]))
        keys = context_rows(k_cache, tables[b], context)
        values = context_rows(v_cache, tables[b], context)
        positions = list(range(context - q_len, context))
        expected[b] = attention_reference(q[rows], keys, values, scale, positions, window)
    first_needed = [max(0, c - q_len - window + 1) for q_len, c in PREFILL_SHAPES]
    poison_before_windows(k_cache, v_cache, tables, first_needed, block_size)
    out = kernels.paged_prefill_attention(
        q,
        k_cache,
        v_cache,
        tables,
        torch.tensor(contexts, dtype=torch.int32),
        starts,
        scale,
        backend=backend,
        window=window,
    )
    for b, want in expected.items():
        rows = slice(int(starts[b]), int(starts[b + 1]))
        assert rel_error(out[rows], want) < 1e-4, f"sequence {b} {PREFILL_SHAPES[b]}"


@pytest.mark.parametrize("dtype,tolerance", [(torch.float32, 1e-5), (torch.bfloat16, 1e-2)])
@pytest.mark.parametrize("head_dim", [64, 256])
def test_native_and_torch_windowed_paths_match_float64(dtype, tolerance, head_dim):
    """The native decode kernel and both torch references, directly, in both dtypes; the
    prefill's long runs (torch SDPA) and short runs (native) each against float64."""
    native = attention_cpu.native_attention()
    assert native is not None, attention_cpu.native_attention_error()
    torch.manual_seed(head_dim)
    window, block_size = 10, 8
    lens = [3, 10, 11, 25, 64]
    k_cache, v_cache, tables = build_paged_cache(lens, 2, head_dim, block_size, dtype)
    q = torch.randn(len(lens), 4, head_dim).to(dtype)
    scale = 1 / math.sqrt(head_dim)
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    runs = [
        native.decode(q, k_cache, v_cache, tables, seq_lens, scale, window),
        decode_attention._decode_torch(q, k_cache, v_cache, tables, seq_lens, scale, window),
    ]
    for out in runs:
        for b, n in enumerate(lens):
            keys = context_rows(k_cache, tables[b], n)
            values = context_rows(v_cache, tables[b], n)
            want = attention_reference(q[b : b + 1], keys, values, scale, [n - 1], window)
            assert rel_error(out[b : b + 1], want) < tolerance, f"sequence {b} (length {n})"
    long_q = torch.randn(64, 4, head_dim).to(dtype)
    starts = torch.tensor([0, 64], dtype=torch.int32)
    one = torch.tensor([64], dtype=torch.int32)
    out = prefill_attention._prefill_torch(
        long_q, k_cache, v_cache, tables[4:], one, starts, scale, window
    )
    keys, values = context_rows(k_cache, tables[4], 64), context_rows(v_cache, tables[4], 64)
    want = attention_reference(long_q, keys, values, scale, list(range(64)), window)
    assert rel_error(out, want) < tolerance


def test_a_bad_window_is_refused():
    k_cache, v_cache, tables = build_paged_cache([5], 2, 64, 16)
    seq_lens = torch.tensor([5], dtype=torch.int32)
    q = torch.randn(1, 4, 64)
    for bad in (-1, 2.5, True):
        with pytest.raises(ValueError, match="window must be an int >= 0"):
            kernels.paged_decode_attention(q, k_cache, v_cache, tables, seq_lens, 1, window=bad)
        with pytest.raises(ValueError, match="window must be an int >= 0"):
            kernels.paged_prefill_attention(
                q, k_cache, v_cache, tables, seq_lens, torch.tensor([0, 1]), 1, window=bad
            )
