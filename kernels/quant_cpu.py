"""The native CPU kernels for block-format weights (quant_cpu.c), loaded with ctypes.

Three paths in one library: 16-lane AVX-512 vectors (compiled for AVX-512 whatever the
build's -march, for the 32-weight formats and the integer ones; the k-quants take the 8-lane
path), 8-lane vectors (AVX2 and FMA on x86, built -march=native) and scalar loops.
``vector_path`` says which one this CPU runs, from its flags read at run time (cpu_isa.py),
never assumed; the tests run each this machine has. Where the library cannot be built,
``native_quant()`` is None and quant_linear.py runs its torch path (``native_quant_error()``
says why).
"""

from __future__ import annotations

import ctypes
import functools
import platform
from pathlib import Path

import torch

from . import _native
from .cpu_isa import AVX2_FLAGS, this_cpu_flags
from .quant_blocks import QuantizedWeight, block_format

SCALAR, VECTOR, AVX512 = 0, 1, 2  # the paths, as the library's ``vector`` argument takes them
AVX512_FLAGS = ("avx512f", "avx512bw", "avx512vl")

_I64, _I32, _PTR = ctypes.c_int64, ctypes.c_int32, ctypes.c_void_p
_LINEAR = [_I32, _PTR, _I64, _I64, _I64, _PTR, _I64, _I64, _PTR, _PTR, _I64, _I32, _I32]
_DEQUANTIZE = [_I32, _PTR, _I64, _I64, _I64, _PTR, _I64, _I32, _I32]
_PANELS = [_I32, _PTR, _I64, _I64, _I64, _PTR, _I64, _I64, _PTR, _PTR, _I64, _I64, _I32, _I32]


def vector_path(flags: frozenset[str] | None = None) -> int:
    """The path that runs here: AVX512 on x86 with AVX-512 F, BW and VL (and AVX2/FMA);
    VECTOR on x86 with AVX2 and FMA, or a 64-bit Arm (NEON is always there); SCALAR
    elsewhere. (Truthy for both vector paths.)"""
    return _path_here() if flags is None else cpu_paths(flags)[-1]


@functools.cache
def _path_here() -> int:
    return cpu_paths()[-1]  # read once: every product asks


def cpu_paths(flags: frozenset[str] | None = None) -> list[int]:
    """Every path this CPU runs, best last."""
    flags = this_cpu_flags() if flags is None else flags
    if platform.machine().lower() in ("aarch64", "arm64"):
        return [SCALAR, VECTOR]
    if not all(flag in flags for flag in AVX2_FLAGS):
        return [SCALAR]
    x86 = platform.machine().lower() in ("x86_64", "amd64")
    if x86 and all(flag in flags for flag in AVX512_FLAGS):
        return [SCALAR, VECTOR, AVX512]
    return [SCALAR, VECTOR]


class NativeQuant:
    def __init__(self, library: ctypes.CDLL):
        self._linear = library.quant_linear
        self._linear.argtypes, self._linear.restype = _LINEAR, ctypes.c_int
        self._dequantize = library.quant_dequantize
        self._dequantize.argtypes, self._dequantize.restype = _DEQUANTIZE, ctypes.c_int
        self._panels = library.quant_linear_panels
        self._panels.argtypes, self._panels.restype = _PANELS, ctypes.c_int

    def linear(
        self,
        x: torch.Tensor,
        weight: QuantizedWeight,
        bias: torch.Tensor | None,
        out: torch.Tensor,
        vector: int,
    ) -> None:
        """out [m, n] = x [m, k] @ weight^T (+ bias): float32 CPU tensors, rows contiguous;
        ``vector`` the path (SCALAR, VECTOR or AVX512; True/False: VECTOR/SCALAR)."""
        fmt = block_format(weight.format)
        status = self._linear(
            fmt.code,
            x.data_ptr(),
            x.stride(0),
            x.shape[0],
            weight.in_features,
            weight.blocks.data_ptr(),
            weight.blocks.stride(0),
            weight.out_features,
            bias.data_ptr() if bias is not None else None,
            out.data_ptr(),
            out.stride(0),
            int(vector),
            torch.get_num_threads(),
        )
        if status:
            raise ValueError(f"quant_linear refused a {weight.format} weight {weight.shape}")

    def linear_panels(
        self,
        x: torch.Tensor,
        weight: QuantizedWeight,
        bias: torch.Tensor | None,
        out: torch.Tensor,
        panel: int,
        vector: int = 1,
    ) -> None:
        """``linear`` for many rows, on a vector path (``vector``: VECTOR or AVX512): each
        thread dequantizes ``panel`` output rows (a multiple of 3) at a time into its own
        buffer and multiplies every row of x by them."""
        fmt = block_format(weight.format)
        status = self._panels(
            fmt.code,
            x.data_ptr(),
            x.stride(0),
            x.shape[0],
            weight.in_features,
            weight.blocks.data_ptr(),
            weight.blocks.stride(0),
            weight.out_features,
            bias.data_ptr() if bias is not None else None,
            out.data_ptr(),
            out.stride(0),
            panel,
            int(vector),
            torch.get_num_threads(),
        )
        if status:
            raise ValueError(f"quant_linear_panels refused a {weight.format} weight {weight.shape}")

    def dequantize(self, weight: QuantizedWeight, out: torch.Tensor, vector: int) -> None:
        """out [n, k] float32 (rows contiguous) = the weight's rows dequantized."""
        fmt = block_format(weight.format)
        status = self._dequantize(
            fmt.code,
            weight.blocks.data_ptr(),
            weight.blocks.stride(0),
            weight.out_features,
            weight.in_features,
            out.data_ptr(),
            out.stride(0),
            int(vector),
            torch.get_num_threads(),
        )
        if status:
            raise ValueError(f"quant_dequantize refused a {weight.format} weight {weight.shape}")


_library = _native.Loaded(Path(__file__).with_name("quant_cpu.c"), NativeQuant)


def native_quant() -> NativeQuant | None:
    """The loaded kernels, building them on first use; None where they cannot be built."""
    return _library.get()


def native_quant_error() -> str | None:
    return _library.error()
