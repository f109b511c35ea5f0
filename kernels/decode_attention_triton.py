"""Triton decode attention over the paged KV cache.

One program per (sequence, KV head) serves all the query heads that share that KV head (GQA),
so each key and value is read from memory once. Keys are visited in tiles of BLOCK_N positions
with an online softmax (FlashAttention); each position finds its cache block through the
sequence's block table, so the tile size need not equal the cache block size.
"""

import torch
import triton
import triton.language as tl

from . import _backend


@triton.jit
def _decode_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, table_ptr, lens_ptr, out_ptr,
    scale,
    q_stride_b, q_stride_h,
    cache_stride_b, cache_stride_o, cache_stride_h,
    table_stride_b,
    out_stride_b, out_stride_h,
    block_size, group_size, head_dim,
    BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    PRECISION: tl.constexpr,
):  # fmt: skip
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    context = tl.load(lens_ptr + seq)
    groups = tl.arange(0, BLOCK_G)
    dims = tl.arange(0, BLOCK_D)
    heads = kv_head * group_size + groups
    q_mask = (groups[:, None] < group_size) & (dims[None, :] < head_dim)
    q = tl.load(
        q_ptr + seq * q_stride_b + heads[:, None] * q_stride_h + dims[None, :],
        mask=q_mask,
        other=0.0,
    )
    running_max = tl.full([BLOCK_G], float("-inf"), dtype=tl.float32)
    denom = tl.zeros([BLOCK_G], dtype=tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], dtype=tl.float32)
    for start in range(0, context, BLOCK_N):
        pos = start + tl.arange(0, BLOCK_N)
        visible = pos < context
        block = tl.load(table_ptr + seq * table_stride_b + pos // block_size, mask=visible, other=0)
        row = block.to(tl.int64) * cache_stride_b + (pos % block_size) * cache_stride_o
        kv_offsets = row[:, None] + kv_head * cache_stride_h + dims[None, :]
        kv_mask = visible[:, None] & (dims[None, :] < head_dim)
        k = tl.load(k_cache_ptr + kv_offsets, mask=kv_mask, other=0.0)
        v = tl.load(v_cache_ptr + kv_offsets, mask=kv_mask, other=0.0)
        scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
        scores = tl.where(visible[None, :], scores, float("-inf"))
        new_max = tl.maximum(running_max, tl.max(scores, axis=1))
        correction = tl.exp(running_max - new_max)
        probs = tl.exp(scores - new_max[:, None])
        denom = denom * correction + tl.sum(probs, axis=1)
        acc = acc * correction[:, None] + tl.dot(probs.to(v.dtype), v, input_precision=PRECISION)
        running_max = new_max
    acc = acc / denom[:, None]
    tl.store(
        out_ptr + seq * out_stride_b + heads[:, None] * out_stride_h + dims[None, :],
        acc.to(out_ptr.dtype.element_ty),
        mask=q_mask,
    )


def decode_triton(q, k_cache, v_cache, block_tables, seq_lens, scale) -> torch.Tensor:
    batch, heads, head_dim = q.shape
    kv_heads = k_cache.shape[2]
    _backend.require(
        q.stride(2) == 1 and k_cache.stride(3) == 1 and k_cache.stride() == v_cache.stride(),
        "q and the caches need a contiguous head dimension, and the caches equal strides",
    )
    out = _backend.empty_output((batch, heads, head_dim), q)
    if batch == 0:
        return out
    group_size = heads // kv_heads
    _decode_kernel[(batch, kv_heads)](
        q, k_cache, v_cache, block_tables, seq_lens, out,
        float(scale),
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        block_tables.stride(0),
        out.stride(0), out.stride(1),
        k_cache.shape[1], group_size, head_dim,
        BLOCK_G=max(16, triton.next_power_of_2(group_size)),
        BLOCK_N=32 if head_dim <= 128 else 16,
        BLOCK_D=max(16, triton.next_power_of_2(head_dim)),
        PRECISION=_backend.dot_precision(q.dtype),
    )  # fmt: skip
    return out
