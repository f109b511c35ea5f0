"""Triton products with block-format weights (kernels/quant_blocks.py): x @ W^T on CUDA.

One program computes a [BLOCK_M, BLOCK_N] tile of the output. It walks the input in groups
of 32 weights (every format's block is one or more such groups: Q4_K's 256 weights are
eight, each with its own 6-bit scale and min), reads the group's bytes for its BLOCK_N
output rows once, dequantizes them in registers to the values the torch reference
(kernels/quant_dequant.py) gives, and multiplies them into the tile with ``tl.dot``: the
weights cross the memory bus in their quantized size, never as a float copy.

Float32 activations multiply in exact float32 (no TF32: ``_backend.dot_precision``), so the
result is HF's dequantized float32 matmul up to the order of the sums; bfloat16 and float16
activations multiply the weights rounded to their dtype, accumulating in float32, as every
half-precision GPU kernel does. Off CUDA this runs under ``TRITON_INTERPRET=1`` (the tests).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import _backend
from .quant_blocks import QuantizedWeight, block_format

GROUP = 32  # weights per dequantized group: one tl.dot's depth
BLOCK_N = 64


@triton.jit
def _byte(at, mask):
    """The bytes at ``at`` as int32 (0-255)."""
    return tl.load(at, mask=mask, other=0).to(tl.int32)


@triton.jit
def _half(at, mask):
    """The little-endian float16 at ``at``, as float32."""
    bits = _byte(at, mask) | (_byte(at + 1, mask) << 8)
    return bits.to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _single(at, mask):
    """The little-endian float32 at ``at``."""
    bits = _byte(at, mask) | (_byte(at + 1, mask) << 8) | (_byte(at + 2, mask) << 16)
    bits = bits | (_byte(at + 3, mask) << 24)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _signed(at, mask):
    """The int8 at ``at``, as float32."""
    return tl.load(at, mask=mask, other=0).to(tl.int8, bitcast=True).to(tl.float32)


@triton.jit
def _group_values(row, block, sub, mask, FORMAT: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    """float32 [BLOCK_N, 32]: weights 32 sub .. 32 sub + 31 of the block at ``block`` (a
    [BLOCK_N, 1] pointer) for the rows starting at ``row``. FORMAT is BlockFormat.code."""
    lane = tl.arange(0, 32)[None, :]
    if FORMAT == 0:  # Q4_0: d, 16 bytes of nibbles; w = d (q - 8)
        q = (_byte(block + 2 + lane % 16, mask) >> (lane // 16 * 4)) & 15
        values = _half(block, mask) * (q.to(tl.float32) - 8.0)
    elif FORMAT == 1:  # Q4_1: d, m, nibbles; w = d q + m
        q = (_byte(block + 4 + lane % 16, mask) >> (lane // 16 * 4)) & 15
        values = _half(block, mask) * q.to(tl.float32) + _half(block + 2, mask)
    elif FORMAT == 2:  # Q5_0: d, 4 bytes of fifth bits, nibbles; w = d (q - 16)
        q = (_byte(block + 6 + lane % 16, mask) >> (lane // 16 * 4)) & 15
        q = q | (((_byte(block + 2 + lane // 8, mask) >> (lane % 8)) & 1) << 4)
        values = _half(block, mask) * (q.to(tl.float32) - 16.0)
    elif FORMAT == 3:  # Q5_1: d, m, fifth bits, nibbles; w = d q + m
        q = (_byte(block + 8 + lane % 16, mask) >> (lane // 16 * 4)) & 15
        q = q | (((_byte(block + 4 + lane // 8, mask) >> (lane % 8)) & 1) << 4)
        values = _half(block, mask) * q.to(tl.float32) + _half(block + 2, mask)
    elif FORMAT == 4:  # Q8_0: d, 32 int8; w = d q
        values = _half(block, mask) * _signed(block + 2 + lane, mask)
    elif FORMAT == 5 or FORMAT == 6:  # Q4_K / Q5_K: 6-bit scale and min per group
        this = _byte(block + 4 + sub, mask)  # scales 0-3 / mins 0-3 (sub >= 4: their tops)
        next4 = _byte(block + 8 + sub, mask)  # mins 0-3 / mixed low bits of 4-7
        low = _byte(block + 4 + sub % 4, mask)  # the scale byte whose top bits group 4-7 use
        scale = tl.where(sub < 4, this & 63, (next4 & 15) | ((low >> 6) << 4))
        least = tl.where(sub < 4, next4 & 63, (next4 >> 4) | ((this >> 6) << 4))
        if FORMAT == 5:
            q = (_byte(block + 16 + sub // 2 * 32 + lane, mask) >> (sub % 2 * 4)) & 15
        else:
            q = (_byte(block + 48 + sub // 2 * 32 + lane, mask) >> (sub % 2 * 4)) & 15
            q = q | (((_byte(block + 16 + lane, mask) >> sub) & 1) << 4)
        d = _half(block, mask) * scale.to(tl.float32)
        dmin = _half(block + 2, mask) * least.to(tl.float32)
        values = d * q.to(tl.float32) - dmin
    elif FORMAT == 7:  # Q6_K: nibbles, two-bit highs, int8 scale per 16, d last
        half = sub // 4
        part = sub % 4
        q = (_byte(block + half * 64 + part % 2 * 32 + lane, mask) >> (part // 2 * 4)) & 15
        q = q | (((_byte(block + 128 + half * 32 + lane, mask) >> (part * 2)) & 3) << 4)
        scale = _signed(block + 192 + sub * 2 + lane // 16, mask)
        values = (_half(block + 208, mask) * scale) * (q.to(tl.float32) - 32.0)
    elif FORMAT == 8:  # I8_CH: the row's float32 scale, then int8s
        values = _single(row, mask) * _signed(block + lane, mask)
    else:  # I4_G*: d f32, z u8, nibbles (byte i: weight i low, i + size/2 high)
        at = sub * 32 + lane
        q = (_byte(block + 5 + at % (BLOCK_SIZE // 2), mask) >> (at // (BLOCK_SIZE // 2) * 4)) & 15
        values = (q - _byte(block + 4, mask)).to(tl.float32) * _single(block, mask)
    return values


@triton.jit
def _quant_matmul_kernel(
    x_ptr,
    w_ptr,
    bias_ptr,
    out_ptr,
    rows,
    outputs,
    groups,
    x_stride,
    w_stride,
    out_stride,
    HAS_BIAS: tl.constexpr,
    FORMAT: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_BYTES: tl.constexpr,
    ROW_HEADER: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PRECISION: tl.constexpr,
):
    m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok = m < rows
    n_ok = n < outputs
    row = w_ptr + n[:, None].to(tl.int64) * w_stride
    per_block: tl.constexpr = BLOCK_SIZE // 32
    lane = tl.arange(0, 32)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for g in range(0, groups):
        block = row + ROW_HEADER + (g // per_block) * BLOCK_BYTES
        w = _group_values(row, block, g % per_block, n_ok[:, None], FORMAT, BLOCK_SIZE)
        x = tl.load(
            x_ptr + m[:, None].to(tl.int64) * x_stride + g * 32 + lane[None, :],
            mask=m_ok[:, None],
            other=0.0,
        )
        acc += tl.dot(x, tl.trans(w.to(x.dtype)), input_precision=PRECISION)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    tl.store(
        out_ptr + m[:, None].to(tl.int64) * out_stride + n[None, :],
        acc.to(out_ptr.dtype.element_ty),
        mask=m_ok[:, None] & n_ok[None, :],
    )


def quantized_matmul(
    x: torch.Tensor, weight: QuantizedWeight, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """``F.linear(x, dequantize(weight), bias)`` with x [rows, in] (float32, bfloat16 or
    float16) on the weight's device; the result in x's dtype. The weight's columns must be
    in input order (quant_linear.py reorders x for act-order GPTQ before calling)."""
    _backend.require(weight.input_order is None, "the Triton product takes input-ordered blocks")
    _backend.require(
        x.dim() == 2 and x.shape[1] == weight.in_features,
        lambda: f"x must be [rows, {weight.in_features}], got {list(x.shape)}",
    )
    _backend.require(
        x.dtype in (torch.float32, torch.bfloat16, torch.float16),
        lambda: f"x must be float32, bfloat16 or float16, got {x.dtype}",
    )
    fmt = block_format(weight.format)
    if x.stride(-1) != 1:
        x = x.contiguous()
    out = _backend.empty_output((x.shape[0], weight.out_features), x)
    if x.shape[0] == 0 or weight.out_features == 0:
        return out
    block_m = 16 if x.shape[0] <= 16 else 64
    grid = (triton.cdiv(x.shape[0], block_m), triton.cdiv(weight.out_features, BLOCK_N))
    _quant_matmul_kernel[grid](
        x,
        weight.blocks,
        bias if bias is not None else x,
        out,
        x.shape[0],
        weight.out_features,
        weight.in_features // GROUP,
        x.stride(0),
        weight.blocks.stride(0),
        out.stride(0),
        HAS_BIAS=bias is not None,
        FORMAT=fmt.code,
        BLOCK_SIZE=fmt.block_size,
        BLOCK_BYTES=fmt.block_bytes,
        ROW_HEADER=fmt.row_header,
        BLOCK_M=block_m,
        BLOCK_N=BLOCK_N,
        PRECISION=_backend.dot_precision(x.dtype),
    )
    return out
