"""Triton prefill / mixed-batch attention over the paged KV cache.

One program per (sequence, tile of BLOCK_M new tokens, query head). A sequence's q_len new
tokens are the last q_len positions of its context, so query i sits at position
context - q_len + i and attends keys 0..that position: cached prefix included, causal inside.
Keys are visited in BLOCK_N tiles through the block table with an online softmax.
"""

from itertools import pairwise

import triton
import triton.language as tl

from . import _backend
from .prefill_attention import check_query_layout


@triton.jit
def _prefill_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    table_ptr,
    lens_ptr,
    starts_ptr,
    out_ptr,
    scale,
    q_stride_t,
    q_stride_h,
    cache_stride_b,
    cache_stride_o,
    cache_stride_h,
    table_stride_b,
    out_stride_t,
    out_stride_h,
    block_size,
    group_size,
    head_dim,
    window,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PRECISION: tl.constexpr,
):
    seq = tl.program_id(0)
    tile = tl.program_id(1)
    head = tl.program_id(2)
    kv_head = head // group_size
    first_row = tl.load(starts_ptr + seq)
    q_len = tl.load(starts_ptr + seq + 1) - first_row
    if tile * BLOCK_M >= q_len:
        return
    context = tl.load(lens_ptr + seq)
    rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < q_len
    q_pos = context - q_len + rows  # context position of each query
    dims = tl.arange(0, BLOCK_D)
    q_mask = row_ok[:, None] & (dims[None, :] < head_dim)
    token = (first_row + rows).to(tl.int64)
    q = tl.load(
        q_ptr + token[:, None] * q_stride_t + head * q_stride_h + dims[None, :],
        mask=q_mask,
        other=0.0,
    )
    running_max = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    denom = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    # Keys past the tile's last query are never visible to it.
    key_end = tl.minimum(context, context - q_len + (tile + 1) * BLOCK_M)
    # Under a sliding window, keys at or before the tile's first query - window are not either.
    first_seen = tl.maximum(0, context - q_len + tile * BLOCK_M - window + 1)
    key_begin = tl.where(window > 0, first_seen, 0)
    for start in range(key_begin // BLOCK_N * BLOCK_N, key_end, BLOCK_N):
        pos = start + tl.arange(0, BLOCK_N)
        in_context = (pos >= key_begin) & (pos < key_end)
        block = tl.load(
            table_ptr + seq * table_stride_b + pos // block_size, mask=in_context, other=0
        )
        kv_row = block.to(tl.int64) * cache_stride_b + (pos % block_size) * cache_stride_o
        kv_offsets = kv_row[:, None] + kv_head * cache_stride_h + dims[None, :]
        kv_mask = in_context[:, None] & (dims[None, :] < head_dim)
        k = tl.load(k_cache_ptr + kv_offsets, mask=kv_mask, other=0.0)
        v = tl.load(v_cache_ptr + kv_offsets, mask=kv_mask, other=0.0)
        scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
        visible = in_context[None, :] & (pos[None, :] <= q_pos[:, None])
        visible = visible & ((window == 0) | (pos[None, :] > q_pos[:, None] - window))
        scores = tl.where(visible, scores, float("-inf"))
        # Rows past q_len see nothing; keep their max finite so exp() stays NaN-free.
        new_max = tl.maximum(running_max, tl.max(scores, axis=1))
        safe_max = tl.where(new_max == float("-inf"), 0.0, new_max)
        correction = tl.exp(running_max - safe_max)
        probs = tl.exp(scores - safe_max[:, None])
        denom = denom * correction + tl.sum(probs, axis=1)
        acc = acc * correction[:, None] + tl.dot(probs.to(v.dtype), v, input_precision=PRECISION)
        running_max = new_max
    acc = acc / tl.where(denom == 0.0, 1.0, denom)[:, None]
    tl.store(
        out_ptr + token[:, None] * out_stride_t + head * out_stride_h + dims[None, :],
        acc.to(out_ptr.dtype.element_ty),
        mask=q_mask,
    )


def prefill_triton(
    q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale, window: int = 0
):
    num_tokens, heads, head_dim = q.shape
    _backend.require(
        q.stride(2) == 1 and k_cache.stride(3) == 1 and k_cache.stride() == v_cache.stride(),
        "q and the caches need a contiguous head dimension, and the caches equal strides",
    )
    starts, lens = query_start_loc.tolist(), seq_lens.tolist()
    check_query_layout(starts, lens, num_tokens)
    out = _backend.empty_output((num_tokens, heads, head_dim), q)
    max_q_len = max((end - begin for begin, end in pairwise(starts)), default=0)
    if num_tokens == 0 or max_q_len == 0:
        return out
    block_m = 16
    grid = (len(lens), triton.cdiv(max_q_len, block_m), heads)
    _prefill_kernel[grid](
        q,
        k_cache,
        v_cache,
        block_tables,
        seq_lens,
        query_start_loc,
        out,
        float(scale),
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        block_tables.stride(0),
        out.stride(0),
        out.stride(1),
        k_cache.shape[1],
        heads // k_cache.shape[2],
        head_dim,
        window,
        BLOCK_M=block_m,
        BLOCK_N=32,
        BLOCK_D=max(16, triton.next_power_of_2(head_dim)),
        PRECISION=_backend.dot_precision(q.dtype),
    )
    return out
