"""The optional fast mode of block-format products: activations quantized to int8.

llama.cpp's CPU dot products quantize each activation row to int8 per 32 values and multiply
in integers; loragate's default keeps activations in float32 (exact up to summation order
against the dequantized weight). This mode (``EngineConfig.activation_quantization="int8"``,
``loragate serve --activation-quantization int8``) does what llama.cpp does for the 32-weight
formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) and the K-quants (Q4_K, Q5_K, Q6_K: each 32-weight
sub-block against the rows' int8 block, as llama.cpp's q8_K products do) in decode-sized
products, and for the 32-weight formats in products of any size where the CPU has AMX-INT8
tiles; loragate's own integer formats, and elsewhere prefill-sized products, keep the
float32 path. Its outputs differ from the float32 ones by the activations'
rounding: held to top-5-closeness, never the default.
(quant_int8_cpu.c; built per machine like the other kernels. Four paths: AMX-INT8's tdpbssd
on tiles of 16 rows by 16 outputs (int8_tiles.h) for products of ``AMX_ROWS`` rows or more,
AVX512-VNNI's vpdpbusd, AVX2's vpmaddubsw and vpmaddwd, and portable loops; the best the CPU
runs is chosen from its flags, the tiles only once Linux has lent the process their state.
Where the build has no AMX the tiles are emulated in plain C, for the tests alone.)
"""

from __future__ import annotations

import ctypes
import functools
import threading
from pathlib import Path

import torch

from . import _native
from .cpu_isa import has_amx_int8, this_cpu_flags
from .lora_cpu import TILES_NATIVE  # the tiles' states, as lora_tiles_ready gives them too
from .quant_blocks import QuantizedWeight, block_format

ACTIVATION_QUANTIZATIONS = ("int8",)
TILE_FORMATS = frozenset({"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"})  # the tiles take these
K_FORMATS = frozenset({"Q4_K", "Q5_K", "Q6_K"})
FORMATS = TILE_FORMATS | K_FORMATS
BLOCK = 32

_I64, _I32, _PTR = ctypes.c_int64, ctypes.c_int32, ctypes.c_void_p
_QUANTIZE = [_PTR, _I64, _I64, _I64, _PTR, _PTR, _PTR]
_LINEAR = [_I32, _PTR, _PTR, _PTR, _I64, _I64, _PTR, _I64, _I64, _PTR, _PTR, _I64, _I32, _I32]
_LINEAR_ROWS = [_I32, _PTR, _I64, _I64, _I64, _PTR, _PTR, _I64, _I64, _PTR, _PTR, _I64, _I32, _I32]
# the paths, as the library's ``path`` argument takes them
PORTABLE, VNNI, AVX2, AMX_INT8 = 0, 1, 2, 3
AMX_ROWS = 16  # from one tile of rows on, products go to the tiles (where the CPU has them)
AVX2_FLAGS = ("avx2", "fma", "f16c")
VNNI_FLAGS = (*AVX2_FLAGS, "avx512f", "avx512vl", "avx512_vnni")


class Int8Rows:
    """Activation rows quantized to int8 per 32 values: ``q`` [m, k] int8, ``d`` [m, k/32]
    float32 scales, ``s`` [m, k/32] int32 sums of each block's values."""

    def __init__(self, q: torch.Tensor, d: torch.Tensor, s: torch.Tensor):
        self.q, self.d, self.s = q, d, s


class NativeInt8:
    """The loaded library. ``tiles``: whether its AMX_INT8 path runs AMX tiles in this
    process (lora_cpu.TILES_NATIVE), only their emulation (TILES_EMULATED: a build without
    AMX) or nothing (TILES_REFUSED: Linux refused the tile state); asked once, on loading."""

    def __init__(self, library: ctypes.CDLL):
        self._quantize = library.q8_quantize_rows
        self._quantize.argtypes, self._quantize.restype = _QUANTIZE, None
        self._linear = library.q8_linear
        self._linear.argtypes, self._linear.restype = _LINEAR, ctypes.c_int
        self._linear_rows = library.q8_linear_rows
        self._linear_rows.argtypes, self._linear_rows.restype = _LINEAR_ROWS, ctypes.c_int
        self._scratch_bytes = library.q8_rows_scratch_bytes
        self._scratch_bytes.argtypes, self._scratch_bytes.restype = [_I64, _I64], _I64
        self._scratch = threading.local()
        self.has_simd_paths = bool(library.q8_has_simd_paths())
        library.q8_tiles_ready.restype = ctypes.c_int
        self.tiles = library.q8_tiles_ready()

    def quantize_rows(self, x: torch.Tensor) -> Int8Rows:
        """x [m, k] float32 (rows contiguous, k a multiple of 32) as int8 rows."""
        m, k = x.shape
        q = torch.empty((m, k), dtype=torch.int8)
        d = torch.empty((m, k // BLOCK), dtype=torch.float32)
        s = torch.empty((m, k // BLOCK), dtype=torch.int32)
        self._quantize(x.data_ptr(), x.stride(0), m, k, q.data_ptr(), d.data_ptr(), s.data_ptr())
        return Int8Rows(q, d, s)

    def linear(
        self,
        rows: Int8Rows,
        weight: QuantizedWeight,
        bias: torch.Tensor | None,
        out: torch.Tensor,
        path: int | None = None,
    ) -> None:
        """out [m, n] = the int8 rows times weight^T (+ bias), float32; ``path``: AMX_INT8,
        VNNI, AVX2 or PORTABLE (default: the best this CPU runs for m rows)."""
        m = rows.q.shape[0]
        rows_args = (rows.q.data_ptr(), rows.d.data_ptr(), rows.s.data_ptr(), m, weight.in_features)
        self._product(self._linear, rows_args, m, weight, bias, out, path)

    def linear_rows(
        self,
        x: torch.Tensor,
        weight: QuantizedWeight,
        bias: torch.Tensor | None,
        out: torch.Tensor,
        path: int | None = None,
    ) -> None:
        """``linear(quantize_rows(x), ...)`` in one native call, the int8 rows in a buffer
        the calling thread reuses (the decode step's products: one call each, no tensors
        made). x [m, k] float32, rows contiguous."""
        m, k = x.shape
        rows_args = (x.data_ptr(), x.stride(0), m, k, self._scratch_for(m, k).data_ptr())
        self._product(self._linear_rows, rows_args, m, weight, bias, out, path)

    def _product(self, fn, rows_args: tuple, m: int, weight, bias, out, path) -> None:
        """``fn`` (q8_linear or q8_linear_rows) on the rows its ``rows_args`` name and the
        weight, bias and output these do; a ValueError where the library refuses."""
        status = fn(
            block_format(weight.format).code,
            *rows_args,
            weight.blocks.data_ptr(),
            weight.blocks.stride(0),
            weight.out_features,
            bias.data_ptr() if bias is not None else None,
            out.data_ptr(),
            out.stride(0),
            int8_path(m, weight.format in TILE_FORMATS) if path is None else path,
            torch.get_num_threads(),
        )
        if status:
            raise ValueError(f"q8_linear refused a {weight.format} weight {weight.shape}")

    def _scratch_for(self, m: int, k: int) -> torch.Tensor:
        """The calling thread's buffer for m rows of k int8 activations (grown as needed;
        64 bytes of slack so its start can be aligned)."""
        size = self._scratch_bytes(m, k) + 64
        held = getattr(self._scratch, "buffer", None)
        if held is None or held.numel() < size:
            held = self._scratch.buffer = torch.empty(size, dtype=torch.uint8)
        return held[-held.data_ptr() % 64 :]


_library = _native.Loaded(Path(__file__).with_name("quant_int8_cpu.c"), NativeInt8)


def native_int8() -> NativeInt8 | None:
    """The loaded kernels, building them on first use; None where they cannot be built."""
    return _library.get()


def int8_paths(flags: frozenset[str] | None = None, tiles: int | None = None) -> list[int]:
    """Every path this CPU runs, best last: the portable loops everywhere; AVX2 where the
    CPU has AVX2, FMA and F16C; AVX512-VNNI where it also has AVX-512 F and VL and VNNI
    (the SIMD paths where the build has them: x86 with GCC); AMX-INT8 where it has AMX's
    tiles and their int8 products and the library's tiles are AMX with the tile state lent
    (``tiles``: as ``NativeInt8.tiles`` says; default the library's)."""
    flags = this_cpu_flags() if flags is None else flags
    kernels = native_int8()
    paths = [PORTABLE]
    if kernels is None or not kernels.has_simd_paths:
        return paths
    if all(f in flags for f in AVX2_FLAGS):
        paths.append(AVX2)
    if all(f in flags for f in VNNI_FLAGS):
        paths.append(VNNI)
    tiles = kernels.tiles if tiles is None else tiles
    if has_amx_int8(flags) and tiles == TILES_NATIVE:
        paths.append(AMX_INT8)
    return paths


@functools.cache
def _paths_here() -> tuple[int, ...]:
    return tuple(int8_paths())  # read once: every product in the mode asks


def int8_path(rows: int = 1, tiles: bool = True) -> int:
    """The best path here for a product of ``rows`` rows: the tiles from AMX_ROWS rows on
    (fewer rows would fill a tile's rows with zeros) for a format they take (``tiles``), the
    best other path below."""
    paths = _paths_here()
    if paths[-1] == AMX_INT8 and (rows < AMX_ROWS or not tiles):
        return paths[-2]
    return paths[-1]


def takes_all_rows(weight: QuantizedWeight | None = None) -> bool:
    """Whether the mode takes products of any number of rows here (where the AMX tiles
    run), not only decode-sized ones: of ``weight`` (default: a format the tiles take)."""
    tiles = weight is None or weight.format in TILE_FORMATS
    return tiles and int8_path(AMX_ROWS) == AMX_INT8


def takes_int8(weight: QuantizedWeight) -> bool:
    """Whether the int8 mode covers this weight (a GGUF block format, in its own order)."""
    return weight.format in FORMATS and weight.input_order is None
