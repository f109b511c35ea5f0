"""Triton decode attention over the paged KV cache (FlashDecoding).

One program per (sequence, KV head, context partition) serves all the query heads that share
that KV head (GQA), so each key and value is read from memory once. Keys are visited in tiles
of BLOCK_N positions with an online softmax; each position finds its cache block through the
sequence's block table, so the tile size need not equal the cache block size.

With few sequences the (sequence, KV head) grid cannot fill a GPU, so long contexts are split
into partitions whose partial results (running max, denominator, unnormalised sum) a second
kernel merges. The partition count comes from the block-table width, which bounds every
context, so no sequence length is read back to the host.
"""

import torch
import triton
import triton.language as tl

from . import _backend

PARTITION_SIZE = 512
# Below this many (sequence, KV head) programs a GPU has idle SMs: split the context.
SPLIT_BELOW_PROGRAMS = 512


@triton.jit
def _decode_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    table_ptr,
    lens_ptr,
    out_ptr,
    part_max_ptr,
    part_sum_ptr,
    part_acc_ptr,
    scale,
    q_stride_b,
    q_stride_h,
    cache_stride_b,
    cache_stride_o,
    cache_stride_h,
    table_stride_b,
    out_stride_b,
    out_stride_h,
    block_size,
    group_size,
    num_heads,
    head_dim,
    num_partitions,
    partition_size,
    window,
    BLOCK_G: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    SPLIT: tl.constexpr,
    PRECISION: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    part = tl.program_id(2)
    context = tl.load(lens_ptr + seq)
    begin = part * partition_size
    end = tl.minimum(context, begin + partition_size)
    # A sliding window: positions before context - window are never read.
    begin = tl.where(window > 0, tl.maximum(begin, context - window), begin)
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
    for start in range(begin, end, BLOCK_N):
        pos = start + tl.arange(0, BLOCK_N)
        visible = pos < end
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
    if SPLIT:
        # Partials indexed [seq, head, partition]; an empty partition leaves max -inf, sum 0.
        row_ids = (seq * num_heads + heads) * num_partitions + part
        g_ok = groups < group_size
        tl.store(part_max_ptr + row_ids, running_max, mask=g_ok)
        tl.store(part_sum_ptr + row_ids, denom, mask=g_ok)
        tl.store(part_acc_ptr + row_ids[:, None] * BLOCK_D + dims[None, :], acc, mask=q_mask)
    else:
        acc = acc / denom[:, None]
        tl.store(
            out_ptr + seq * out_stride_b + heads[:, None] * out_stride_h + dims[None, :],
            acc.to(out_ptr.dtype.element_ty),
            mask=q_mask,
        )


@triton.jit
def _merge_kernel(
    part_max_ptr,
    part_sum_ptr,
    part_acc_ptr,
    out_ptr,
    out_stride_b,
    out_stride_h,
    num_heads,
    head_dim,
    num_partitions,
    BLOCK_P: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    parts = tl.arange(0, BLOCK_P)
    dims = tl.arange(0, BLOCK_D)
    rows = (seq * num_heads + head) * num_partitions + parts
    part_ok = parts < num_partitions
    maxes = tl.load(part_max_ptr + rows, mask=part_ok, other=float("-inf"))
    sums = tl.load(part_sum_ptr + rows, mask=part_ok, other=0.0)
    overall = tl.max(maxes, axis=0)  # finite: partition 0 always holds a token
    weights = tl.where(part_ok & (maxes > float("-inf")), tl.exp(maxes - overall), 0.0)
    accs = tl.load(
        part_acc_ptr + rows[:, None] * BLOCK_D + dims[None, :],
        mask=part_ok[:, None] & (dims[None, :] < head_dim),
        other=0.0,
    )
    total = tl.sum(accs * weights[:, None], axis=0) / tl.sum(sums * weights, axis=0)
    tl.store(
        out_ptr + seq * out_stride_b + head * out_stride_h + dims,
        total.to(out_ptr.dtype.element_ty),
        mask=dims < head_dim,
    )


def decode_triton(
    q,
    k_cache,
    v_cache,
    block_tables,
    seq_lens,
    scale,
    partition_size: int | None = None,
    window: int = 0,
) -> torch.Tensor:
    """partition_size: context split (None: PARTITION_SIZE when the grid is small, else none).
    window > 0: each query sees only the last ``window`` positions of its context."""
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
    block_d = max(16, triton.next_power_of_2(head_dim))
    longest_possible = block_tables.shape[1] * k_cache.shape[1]
    if partition_size is None:
        split = batch * kv_heads < SPLIT_BELOW_PROGRAMS and longest_possible > PARTITION_SIZE
        partition_size = PARTITION_SIZE if split else max(longest_possible, 1)
    block_n = 32 if head_dim <= 128 else 16
    num_partitions = triton.cdiv(longest_possible, partition_size)
    split = num_partitions > 1
    if split:
        part_max = torch.empty(batch * heads * num_partitions, device=q.device)
        part_sum = torch.empty_like(part_max)
        part_acc = torch.empty(batch * heads * num_partitions, block_d, device=q.device)
    else:
        part_max = part_sum = part_acc = out  # unused
    _decode_kernel[(batch, kv_heads, num_partitions)](
        q,
        k_cache,
        v_cache,
        block_tables,
        seq_lens,
        out,
        part_max,
        part_sum,
        part_acc,
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
        group_size,
        heads,
        head_dim,
        num_partitions,
        partition_size,
        window,
        BLOCK_G=max(16, triton.next_power_of_2(group_size)),
        BLOCK_N=block_n,
        BLOCK_D=block_d,
        SPLIT=split,
        PRECISION=_backend.dot_precision(q.dtype),
    )
    if split:
        _merge_kernel[(batch, heads)](
            part_max,
            part_sum,
            part_acc,
            out,
            out.stride(0),
            out.stride(1),
            heads,
            head_dim,
            num_partitions,
            BLOCK_P=triton.next_power_of_2(num_partitions),
            BLOCK_D=block_d,
        )
    return out
