"""Triton batched LoRA (Punica's SGMV): tokens grouped by slot, one tile of a group per program.

The LoraIndex sorts the tokens by slot once per forward pass. A program takes BLOCK_M
consecutive sorted tokens of one slot, so every weight tile it loads is shared by the whole
tile (tl.dot), and tokens of other slots run in other programs of the same launch. Programs
whose tile lies past the end of their slot's group exit at once. Strides are passed through,
so rank-windowed weight views and column slices of a fused output need no copies.
"""

import torch
import triton
import triton.language as tl

from . import _backend
from .lora_groups import LoraIndex

BLOCK_M = 16


@triton.jit
def _group_rows(
    ends_ptr, order_ptr, slot, first_slot, num_groups, num_tokens, tile, BLOCK_M: tl.constexpr
):
    """Token ids of this program's tile of the slot's group (sorted rows), their mask, and
    whether the tile lies past the group's end (nothing to do).

    Group num_groups (one past the last slot) holds the tokens without an adapter.
    """
    # Slots past the last one are empty, so the no-adapter group starts at ends[last_slot].
    start = tl.load(ends_ptr + slot - 1, mask=slot > 0, other=0)
    end = tl.load(ends_ptr + slot, mask=slot - first_slot < num_groups, other=num_tokens)
    rows = start + tile * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < end
    tokens = tl.load(order_ptr + rows, mask=row_ok, other=0)
    return tokens, row_ok, start + tile * BLOCK_M >= end


@triton.jit
def _shrink_kernel(
    x_ptr,
    a_ptr,
    y_ptr,
    ends_ptr,
    order_ptr,
    x_stride_t,
    x_stride_d,
    a_stride_s,
    a_stride_r,
    a_stride_d,
    y_stride_t,
    y_stride_r,
    first_slot,
    num_groups,
    num_tokens,
    rank,
    d_in,
    BLOCK_M: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PRECISION: tl.constexpr,
):
    group = tl.program_id(0)
    slot = first_slot + group
    tokens, row_ok, idle = _group_rows(
        ends_ptr, order_ptr, slot, first_slot, num_groups, num_tokens, tl.program_id(1), BLOCK_M
    )
    if idle:
        return
    ranks = tl.program_id(2) * BLOCK_R + tl.arange(0, BLOCK_R)
    acc = tl.zeros([BLOCK_M, BLOCK_R], dtype=tl.float32)
    if group < num_groups:
        tokens64 = tokens.to(tl.int64)
        for k in range(0, d_in, BLOCK_K):
            cols = k + tl.arange(0, BLOCK_K)
            x = tl.load(
                x_ptr + tokens64[:, None] * x_stride_t + cols[None, :] * x_stride_d,
                mask=row_ok[:, None] & (cols[None, :] < d_in),
                other=0.0,
            )
            a = tl.load(
                a_ptr
                + slot.to(tl.int64) * a_stride_s
                + ranks[:, None] * a_stride_r
                + cols[None, :] * a_stride_d,
                mask=(ranks[:, None] < rank) & (cols[None, :] < d_in),
                other=0.0,
            )
            acc += tl.dot(x.to(a.dtype), tl.trans(a), input_precision=PRECISION)
    # Tokens without an adapter (the last group) get the zeros acc still holds.
    tl.store(
        y_ptr + tokens[:, None].to(tl.int64) * y_stride_t + ranks[None, :] * y_stride_r,
        acc.to(y_ptr.dtype.element_ty),
        mask=row_ok[:, None] & (ranks[None, :] < rank),
    )


@triton.jit
def _expand_kernel(
    y_ptr,
    b_ptr,
    scales_ptr,
    out_ptr,
    ends_ptr,
    order_ptr,
    y_stride_t,
    y_stride_r,
    b_stride_s,
    b_stride_o,
    b_stride_r,
    out_stride_t,
    out_stride_o,
    first_slot,
    num_groups,
    num_tokens,
    rank,
    d_out,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PRECISION: tl.constexpr,
):
    slot = first_slot + tl.program_id(0)
    tokens, row_ok, idle = _group_rows(
        ends_ptr, order_ptr, slot, first_slot, num_groups, num_tokens, tl.program_id(1), BLOCK_M
    )
    if idle:
        return
    tokens64 = tokens.to(tl.int64)
    outs = tl.program_id(2) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k in range(0, rank, BLOCK_K):
        ranks = k + tl.arange(0, BLOCK_K)
        y = tl.load(
            y_ptr + tokens64[:, None] * y_stride_t + ranks[None, :] * y_stride_r,
            mask=row_ok[:, None] & (ranks[None, :] < rank),
            other=0.0,
        )
        b = tl.load(
            b_ptr
            + slot.to(tl.int64) * b_stride_s
            + outs[:, None] * b_stride_o
            + ranks[None, :] * b_stride_r,
            mask=(outs[:, None] < d_out) & (ranks[None, :] < rank),
            other=0.0,
        )
        acc += tl.dot(y.to(b.dtype), tl.trans(b), input_precision=PRECISION)
    scale = tl.load(scales_ptr + slot).to(tl.float32)
    out_ptrs = out_ptr + tokens64[:, None] * out_stride_t + outs[None, :] * out_stride_o
    out_mask = row_ok[:, None] & (outs[None, :] < d_out)
    previous = tl.load(out_ptrs, mask=out_mask, other=0.0)
    updated = previous.to(tl.float32) + scale * acc
    tl.store(out_ptrs, updated.to(out_ptr.dtype.element_ty), mask=out_mask)


def _slot_window(index: LoraIndex) -> tuple[int, int]:
    """First slot in use and how many slots first..last span (0 when no token has one)."""
    if index.num_active == 0:
        return 0, 0
    return index.first_slot, index.last_slot - index.first_slot + 1


def shrink_triton(x: torch.Tensor, lora_a: torch.Tensor, index: LoraIndex) -> torch.Tensor:
    num_tokens, rank, d_in = x.shape[0], lora_a.shape[1], lora_a.shape[2]
    y = _backend.empty_output((num_tokens, rank), lora_a)
    if num_tokens == 0 or rank == 0:
        return y
    first, groups = _slot_window(index)
    block_r = max(16, min(64, triton.next_power_of_2(rank)))
    grid = (groups + 1, triton.cdiv(num_tokens, BLOCK_M), triton.cdiv(rank, block_r))
    _shrink_kernel[grid](
        x,
        lora_a,
        y,
        index.group_ends,
        index.order,
        x.stride(0),
        x.stride(1),
        lora_a.stride(0),
        lora_a.stride(1),
        lora_a.stride(2),
        y.stride(0),
        y.stride(1),
        first,
        groups,
        num_tokens,
        rank,
        d_in,
        BLOCK_M=BLOCK_M,
        BLOCK_R=block_r,
        BLOCK_K=64,
        PRECISION=_backend.dot_precision(lora_a.dtype),
    )
    return y


def expand_triton(
    y: torch.Tensor,
    lora_b: torch.Tensor,
    scales: torch.Tensor,
    out: torch.Tensor,
    index: LoraIndex,
) -> None:
    num_tokens, rank, d_out = y.shape[0], lora_b.shape[2], lora_b.shape[1]
    first, groups = _slot_window(index)
    if groups == 0 or rank == 0 or d_out == 0:
        return
    block_n = 64
    grid = (groups, triton.cdiv(num_tokens, BLOCK_M), triton.cdiv(d_out, block_n))
    _expand_kernel[grid](
        y,
        lora_b,
        scales,
        out,
        index.group_ends,
        index.order,
        y.stride(0),
        y.stride(1),
        lora_b.stride(0),
        lora_b.stride(1),
        lora_b.stride(2),
        out.stride(0),
        out.stride(1),
        first,
        groups,
        num_tokens,
        rank,
        d_out,
        BLOCK_M=BLOCK_M,
        BLOCK_N=block_n,
        BLOCK_K=max(16, min(64, triton.next_power_of_2(rank))),
        PRECISION=_backend.dot_precision(lora_b.dtype),
    )
