"""Rotary position embedding, rotate-half form (HF Llama): x * cos + rotate_half(x) * sin."""

import torch
import triton
import triton.language as tl

from . import _backend
from ._backend import require, resolve_backend
from .norm_rope_cpu import NativeNormRope, native_norm_rope


def apply_rope(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, backend: str | None = None
) -> torch.Tensor:
    """x [T, H, D] rotated by each token's cos/sin [T, D] (HF layout: the D/2 frequencies
    repeated twice). Returns a new tensor; x may be a strided view (a slice of fused qkv)."""
    require(x.dim() == 3, lambda: f"x must be [T, H, D], got shape {tuple(x.shape)}")
    require(x.shape[2] % 2 == 0, lambda: f"head_dim must be even, got {x.shape[2]}")
    require(
        cos.shape == (x.shape[0], x.shape[2]) and sin.shape == cos.shape,
        lambda: (
            f"cos and sin must be [T={x.shape[0]}, D={x.shape[2]}], "
            f"got {tuple(cos.shape)} and {tuple(sin.shape)}"
        ),
    )
    if resolve_backend(backend, x) == "triton":
        return _rope_triton(x, cos, sin)
    cos, sin = cos[:, None, :], sin[:, None, :]
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


def apply_rope_(
    x: torch.Tensor, cos_sin: torch.Tensor, positions: torch.Tensor, backend: str | None = None
) -> None:
    """In place: x [T, H, D] (may be a strided view, such as q and k of a fused qkv output)
    rotated by cos_sin[positions[t]], a [max_positions, 2D] table of cos then sin.

    One call per layer for q and k together, with no gathered cos/sin: on the CPU the native
    kernel (norm_rope_cpu.py) reads the table rows in place; elsewhere this is apply_rope.
    Every position must be a row of cos_sin: the native path does not check (that would cost
    a pass over positions per layer), and the engine's positions are below max_model_len.
    """
    require(x.dim() == 3, lambda: f"x must be [T, H, D], got shape {tuple(x.shape)}")
    require(
        cos_sin.dim() == 2 and cos_sin.shape[1] == 2 * x.shape[2],
        lambda: f"cos_sin must be [positions, 2D={2 * x.shape[2]}], got {tuple(cos_sin.shape)}",
    )
    require(
        positions.shape == (x.shape[0],),
        lambda: f"positions must be [T={x.shape[0]}], got {tuple(positions.shape)}",
    )
    if (
        resolve_backend(backend, x) == "torch"
        and positions.dtype == torch.int64
        and positions.is_contiguous()
        and NativeNormRope.fits(x, cos_sin)
    ):
        native = native_norm_rope()
        if native is not None:
            native.rope(x, cos_sin, positions)
            return
    cos, sin = cos_sin[positions].chunk(2, dim=-1)
    x.copy_(apply_rope(x, cos, sin, backend))


@triton.jit
def _rope_kernel(
    x_ptr,
    cos_ptr,
    sin_ptr,
    out_ptr,
    x_stride_t,
    x_stride_h,
    cos_stride,
    sin_stride,
    out_stride_t,
    out_stride_h,
    num_heads,
    half,
    BLOCK_H: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    heads = tl.arange(0, BLOCK_H)[:, None]
    dims = tl.arange(0, BLOCK_HALF)[None, :]
    mask = (heads < num_heads) & (dims < half)
    first = x_ptr + token * x_stride_t + heads * x_stride_h + dims
    x1 = tl.load(first, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(first + half, mask=mask, other=0.0).to(tl.float32)
    cos1 = tl.load(cos_ptr + token * cos_stride + dims, mask=dims < half, other=0.0)
    cos2 = tl.load(cos_ptr + token * cos_stride + half + dims, mask=dims < half, other=0.0)
    sin1 = tl.load(sin_ptr + token * sin_stride + dims, mask=dims < half, other=0.0)
    sin2 = tl.load(sin_ptr + token * sin_stride + half + dims, mask=dims < half, other=0.0)
    out = out_ptr + token * out_stride_t + heads * out_stride_h + dims
    out_ty = out_ptr.dtype.element_ty
    tl.store(out, (x1 * cos1.to(tl.float32) - x2 * sin1.to(tl.float32)).to(out_ty), mask=mask)
    tl.store(
        out + half, (x2 * cos2.to(tl.float32) + x1 * sin2.to(tl.float32)).to(out_ty), mask=mask
    )


def _rope_triton(x, cos, sin) -> torch.Tensor:
    tokens, heads, head_dim = x.shape
    require(
        x.stride(2) == 1 and cos.stride(1) == 1 and sin.stride(1) == 1,
        "x, cos and sin need a contiguous last dimension",
    )
    out_dtype = torch.promote_types(x.dtype, cos.dtype)
    out = _backend.empty_output((tokens, heads, head_dim), x, out_dtype)
    if tokens:
        _rope_kernel[(tokens,)](
            x,
            cos,
            sin,
            out,
            x.stride(0),
            x.stride(1),
            cos.stride(0),
            sin.stride(0),
            out.stride(0),
            out.stride(1),
            heads,
            head_dim // 2,
            BLOCK_H=triton.next_power_of_2(heads),
            BLOCK_HALF=triton.next_power_of_2(head_dim // 2),
        )
    return out
