"""RMSNorm, optionally fused with the residual add that precedes it in every decoder layer.

Numerics follow HF Llama: normalise in float32, cast back to the input dtype, then scale by
the weight, so float32 outputs match transformers exactly. On the CPU the torch backend runs
the native kernel (norm_rope_cpu.py) where it was built; `_norm_torch` is its reference and
fallback.
"""

import torch
import triton
import triton.language as tl

from . import _backend
from ._backend import require, resolve_backend
from .norm_rope_cpu import NativeNormRope, native_norm_rope


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, backend: str | None = None
) -> torch.Tensor:
    """weight * (x / sqrt(mean(x^2) + eps)) over the last dimension of x [T, hidden]."""
    _check(x, weight)
    if resolve_backend(backend, x) == "triton":
        return _norm_triton(x, None, weight, eps)[0]
    native = _native(x, weight)
    if native is not None:
        out = _backend.empty_output(tuple(x.shape), x)
        native.rms_norm(x, None, weight, eps, out, None)
        return out
    return _norm_torch(x, weight, eps)


def add_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    backend: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual), x + residual): the residual stream and the next layer's input
    in one pass over memory (one kernel on a GPU)."""
    _check(x, weight)
    require(
        residual.shape == x.shape,
        lambda: f"residual shape {tuple(residual.shape)} != x {tuple(x.shape)}",
    )
    if resolve_backend(backend, x) == "triton":
        return _norm_triton(x, residual, weight, eps)
    native = _native(x, residual, weight)
    if native is not None:
        out = _backend.empty_output(tuple(x.shape), x)
        summed = _backend.empty_output(tuple(x.shape), x)
        native.rms_norm(x, residual, weight, eps, out, summed)
        return out, summed
    summed = x + residual
    return _norm_torch(summed, weight, eps), summed


def _native(*tensors: torch.Tensor) -> NativeNormRope | None:
    """The native CPU kernel where it takes these tensors (one dtype, float32 or bfloat16)."""
    return native_norm_rope() if NativeNormRope.fits(*tensors) else None


def _check(x: torch.Tensor, weight: torch.Tensor) -> None:
    require(x.dim() == 2, lambda: f"x must be [T, hidden], got shape {tuple(x.shape)}")
    require(
        weight.shape == x.shape[1:],
        lambda: f"weight must be [hidden={x.shape[1]}], got {tuple(weight.shape)}",
    )


def _norm_torch(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


@triton.jit
def _norm_kernel(
    x_ptr,
    residual_ptr,
    weight_ptr,
    out_ptr,
    sum_ptr,
    x_stride,
    residual_stride,
    out_stride,
    sum_stride,
    hidden,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    x = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        x = x + tl.load(residual_ptr + row * residual_stride + cols, mask=mask, other=0.0)
        tl.store(sum_ptr + row * sum_stride + cols, x, mask=mask)
    x32 = x.to(tl.float32)
    inv_rms = 1.0 / tl.sqrt(tl.sum(x32 * x32, axis=0) / hidden + eps)
    normed = (x32 * inv_rms).to(x.dtype)
    weight = tl.load(weight_ptr + cols, mask=mask, other=0.0)
    tl.store(
        out_ptr + row * out_stride + cols, (weight * normed).to(out_ptr.dtype.element_ty), mask=mask
    )


def _norm_triton(x, residual, weight, eps) -> tuple[torch.Tensor, torch.Tensor]:
    tokens, hidden = x.shape
    require(
        x.stride(1) == 1 and (residual is None or residual.stride(1) == 1),
        "x and residual need a contiguous last dimension",
    )
    out_dtype = torch.promote_types(weight.dtype, x.dtype)
    out = _backend.empty_output((tokens, hidden), x, out_dtype)
    summed = _backend.empty_output((tokens, hidden), x) if residual is not None else out
    if tokens:
        _norm_kernel[(tokens,)](
            x,
            residual if residual is not None else x,
            weight,
            out,
            summed,
            x.stride(0),
            residual.stride(0) if residual is not None else 0,
            out.stride(0),
            summed.stride(0),
            hidden,
            float(eps),
            HAS_RESIDUAL=residual is not None,
            BLOCK=triton.next_power_of_2(hidden),
        )
    return out, summed
