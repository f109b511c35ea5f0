"""Linear layers with their weights laid out once, at load, for the CPU's matrix multiply.

torch's float32 `F.linear` on the CPU calls MKL's sgemm, which repacks the weight on every
call, and on CPUs that are not Intel's takes a slower generic path: on an AMD EPYC (AVX2,
2 cores) oneDNN with the weight reordered once ran the model's projections 1.3-2.3x faster
at decode and prefill sizes, and the vocabulary projection 2.2x (BENCHMARKS.md). vLLM's CPU
backend packs its weights for oneDNN the same way. The sums run in another order than
sgemm's, so results differ from `F.linear` in the last bits (float32 rounding), never more:
tests/kernels/test_linear.py holds both to a float64 reference.

bfloat16 weights are packed too on CPUs with native bf16: there oneDNN's packed product ran
1.1-1.5x `F.linear`'s at the model's shapes (vocabulary projection 1.5x at 64 rows; AMD
EPYC with AVX512-BF16, 2 cores, BENCHMARKS.md).

`LORAGATE_CPU_PACKED_LINEAR=0` keeps plain `F.linear` (to compare, or where oneDNN misbehaves).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .quant_blocks import QuantizedWeight, StackedWeights
from .quant_linear import quantized_linear

DISABLE_ENV = "LORAGATE_CPU_PACKED_LINEAR"


@dataclass(frozen=True)
class PackedWeight:
    """A [out, in] weight in oneDNN's blocked layout (opaque: only `linear` reads it)."""

    packed: torch.Tensor
    out_features: int
    in_features: int


def packing_available(device: torch.device, dtype: torch.dtype, native_bf16: bool = False) -> bool:
    """Whether weights on `device` in `dtype` are packed: float32 on a CPU with oneDNN, and
    bfloat16 where the caller says the CPU multiplies bf16 natively (AVX512-BF16 or AMX;
    the engine reads the CPU's flags, this layer does not)."""
    setting = os.environ.get(DISABLE_ENV, "1").strip()
    if setting not in ("0", "1"):
        raise ValueError(f"{DISABLE_ENV} must be 0 or 1, got {setting!r}")
    packs_dtype = dtype == torch.float32 or (dtype == torch.bfloat16 and native_bf16)
    return (
        setting == "1"
        and torch.device(device).type == "cpu"
        and packs_dtype
        and torch.backends.mkldnn.is_available()
    )


def pack_weight(weight: torch.Tensor, native_bf16: bool = False) -> torch.Tensor | PackedWeight:
    """`weight` in the layout `linear` multiplies fastest; unchanged where none is better
    (and block-format weights, which only kernels/quant_linear.py reads)."""
    if isinstance(weight, (QuantizedWeight, StackedWeights)):
        return weight
    if not packing_available(weight.device, weight.dtype, native_bf16):
        return weight
    out_features, in_features = weight.shape
    try:
        packed = torch.ops.mkldnn._reorder_linear_weight(weight.contiguous())
    except RuntimeError:
        # oneDNN refuses (e.g. bf16 on a CPU without avx512bw/vl/dq or avx_ne_convert, which
        # a caller told bf16 is native may still be): the plain layout works everywhere.
        return weight
    return PackedWeight(packed, out_features, in_features)


def linear(
    x: torch.Tensor,
    weight: torch.Tensor | PackedWeight | QuantizedWeight | StackedWeights,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """`F.linear(x, weight, bias)` for a plain, a packed or a block-format weight
    (kernels/quant_linear.py); x is [tokens, in]."""
    if isinstance(weight, (QuantizedWeight, StackedWeights)):
        return quantized_linear(x, weight, bias)
    if not isinstance(weight, PackedWeight):
        return F.linear(x, weight, bias)
    if x.shape[0] == 0:
        out = x.new_empty((0, weight.out_features))
        return out
    return torch.ops.mkldnn._linear_pointwise(x.contiguous(), weight.packed, bias, "none", [], "")
