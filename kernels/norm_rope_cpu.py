"""The native CPU RMSNorm (+ residual add) and in-place RoPE (norm_rope_cpu.c), via ctypes.

In torch these are five to seven small ops each, with a temporary per op: about a sixth of a
float32 decode step. Each native call is one pass over the rows. Where the library cannot be
built, norm.py and rope.py run their torch versions (``native_norm_rope_error()`` says why).
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from . import _native

_I64, _I32, _PTR, _F32 = ctypes.c_int64, ctypes.c_int32, ctypes.c_void_p, ctypes.c_float
_SUFFIX = {torch.float32: "f32", torch.bfloat16: "bf16"}
_NORM = [_PTR, _I64, _PTR, _I64, _PTR, _PTR, _I64, _PTR, _I64, _I64, _I64, _F32, _I32]
_ROPE = [_PTR, _I64, _I64, _I64, _I64, _I64, _PTR, _I64, _PTR, _I32]


def _function(library, name, argtypes):
    function = getattr(library, name)
    function.argtypes, function.restype = argtypes, None
    return function


class NativeNormRope:
    def __init__(self, library: ctypes.CDLL):
        self._norm = {d: _function(library, f"rms_norm_{s}", _NORM) for d, s in _SUFFIX.items()}
        self._rope = {d: _function(library, f"rope_{s}", _ROPE) for d, s in _SUFFIX.items()}

    @staticmethod
    def fits(*tensors: torch.Tensor) -> bool:
        """CPU tensors of one dtype the kernels take, each with a contiguous last dimension."""
        dtype = tensors[0].dtype
        return dtype in _SUFFIX and all(
            t.dtype == dtype and not t.is_cuda and t.stride(-1) == 1 for t in tensors
        )

    def rms_norm(self, x, residual, weight, eps: float, out, summed) -> None:
        """out = weight * norm(x + residual) and summed = x + residual (residual may be None,
        and then summed is not written)."""
        rows, hidden = x.shape
        self._norm[x.dtype](
            x.data_ptr(),
            x.stride(0),
            residual.data_ptr() if residual is not None else None,
            residual.stride(0) if residual is not None else 0,
            weight.data_ptr(),
            out.data_ptr(),
            out.stride(0),
            summed.data_ptr() if summed is not None else None,
            summed.stride(0) if summed is not None else 0,
            rows,
            hidden,
            eps,
            torch.get_num_threads(),
        )

    def rope(self, x: torch.Tensor, table: torch.Tensor, positions: torch.Tensor) -> None:
        """x [T, H, D] (strided rows and heads) rotated in place by table[positions[t]], a
        [max_positions, 2D] table of cos then sin; positions int64 contiguous."""
        rows, heads, head_dim = x.shape
        self._rope[x.dtype](
            x.data_ptr(),
            x.stride(0),
            x.stride(1),
            rows,
            heads,
            head_dim,
            table.data_ptr(),
            table.stride(0),
            positions.data_ptr(),
            torch.get_num_threads(),
        )


_library = _native.Loaded(Path(__file__).with_name("norm_rope_cpu.c"), NativeNormRope)


def native_norm_rope() -> NativeNormRope | None:
    """The loaded kernels, building them on first use; None where they cannot be built."""
    return _library.get()


def native_norm_rope_error() -> str | None:
    return _library.error()
