"""The native CPU LoRA kernels (lora_cpu.c), compiled once per machine and loaded with ctypes.

At decode sizes torch's grouped matmul costs ~10 us per adapter group per call, which made
16 adapters in a batch cost 20-30% of the base model's step; these per-token loops cost the
same whatever the number of adapters. They take float32 or bfloat16 tensors (float32 sums
either way), so a bf16 model's LoRA calls convert nothing. Built by kernels/_native.py on first
use; where that fails, ``native_lora()`` is None, ``native_lora_error()`` says why, and the
torch path runs instead.
"""

from __future__ import annotations

import ctypes
import logging
import subprocess
import threading
from pathlib import Path

import torch

from . import _backend, _native

log = logging.getLogger(__name__)

_SOURCE = Path(__file__).with_name("lora_cpu.c")
_I64, _I32, _PTR = ctypes.c_int64, ctypes.c_int32, ctypes.c_void_p
_SUFFIX = {torch.float32: "f32", torch.bfloat16: "bf16"}
_SHRINK = [_PTR, _I64, _PTR, _I64, _I64, _PTR, _I64, _PTR, _I64, _I64, _I64, _I32]
_EXPAND = [_PTR, _I64, _PTR, _I64, _I64, _PTR, _PTR, _I64, _PTR, _I64, _I64, _I64, _I32]
_APPLY = [_PTR, _I64, _PTR, _I64, _I64, _PTR, _I64, _I64, _PTR, _PTR, _I64]
_APPLY += [_PTR, _I64, _I64, _I64, _I64, _PTR, _I32]
_APPLY_MODULES = [_PTR, _I64, _PTR, _I64, _PTR, _PTR, _I64, _PTR, _I64, _I64, _I64, _PTR, _I32]
_APPLY_MODULES += [_I64, _I64]
# lora_tiles_ready: 1 where the tiles are AMX and the process may use them, 2 where they are
# emulated (a CPU without AMX: for tests), 0 where Linux refused the tile state.
TILES_REFUSED, TILES_NATIVE, TILES_EMULATED = 0, 1, 2


class ModuleStruct(ctypes.Structure):
    """lora_cpu.c's lora_module: one module's rows per slot (addresses of arrays of a pointer
    and a rank per slot), its row strides and where its columns start."""

    _fields_ = [
        ("a", _PTR),
        ("bt", _PTR),
        ("ranks", _PTR),
        ("a_row", _I64),
        ("b_row", _I64),
        ("d_out", _I64),
        ("column", _I64),
    ]


def _function(library: ctypes.CDLL, name: str, argtypes: list, restype=None):
    function = getattr(library, name)
    function.argtypes = argtypes
    function.restype = restype
    return function


class NativeLoRA:
    """shrink / expand over per-token slots, float32 or bfloat16; rows with slot -1 are left
    to the base. scales are read as float32. ``tiles``: whether bf16 runs can go to AMX
    tiles in this process (TILES_NATIVE), only to their emulation (TILES_EMULATED, a CPU
    without AMX) or not at all (TILES_REFUSED); asked once, when the library loads."""

    def __init__(self, library: ctypes.CDLL):
        self._library = library
        self.tiles = _function(library, "lora_tiles_ready", [], ctypes.c_int)()
        self._shrink, self._expand, self._apply, self._modules = {}, {}, {}, {}
        for dtype, suffix in _SUFFIX.items():
            self._shrink[dtype] = _function(library, f"lora_shrink_{suffix}", _SHRINK)
            self._expand[dtype] = _function(library, f"lora_expand_{suffix}", _EXPAND)
            self._apply[dtype] = _function(library, f"lora_apply_{suffix}", _APPLY)
            name = f"lora_apply_modules_{suffix}"
            self._modules[dtype] = _function(library, name, _APPLY_MODULES, _I64)

    @staticmethod
    def fits(*tensors: torch.Tensor) -> bool:
        """CPU tensors of one dtype the kernels take, each with a contiguous last dimension."""
        dtype = tensors[0].dtype
        if dtype not in _SUFFIX:
            return False
        for t in tensors:
            if t.dtype != dtype or t.is_cuda or t.stride(-1) != 1:
                return False
        return True

    def shrink(self, x: torch.Tensor, lora_a: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        """x [T, d_in], lora_a [S, r, d_in], slots [T] int64 -> y [T, r] (zeros where -1)."""
        num_tokens, rank = x.shape[0], lora_a.shape[1]
        y = _backend.empty_output((num_tokens, rank), x)
        self._shrink[x.dtype](
            x.data_ptr(),
            x.stride(0),
            lora_a.data_ptr(),
            lora_a.stride(0),
            lora_a.stride(1),
            y.data_ptr(),
            y.stride(0),
            slots.data_ptr(),
            num_tokens,
            rank,
            x.shape[1],
            torch.get_num_threads(),
        )
        return y

    def expand(
        self,
        y: torch.Tensor,
        lora_bt: torch.Tensor,
        scales: torch.Tensor,
        out: torch.Tensor,
        slots: torch.Tensor,
    ) -> None:
        """out[t] += scales[s] * y[t] @ lora_bt[s] with s = slots[t]; lora_bt [S, r, d_out]."""
        scales = _float32(scales)
        self._expand[y.dtype](
            y.data_ptr(),
            y.stride(0),
            lora_bt.data_ptr(),
            lora_bt.stride(0),
            lora_bt.stride(1),
            scales.data_ptr(),
            out.data_ptr(),
            out.stride(0),
            slots.data_ptr(),
            y.shape[0],
            y.shape[1],
            out.shape[1],
            torch.get_num_threads(),
        )

    def apply(
        self,
        x: torch.Tensor,
        lora_a: torch.Tensor,
        lora_bt: torch.Tensor,
        scales: torch.Tensor,
        out: torch.Tensor,
        slots: torch.Tensor,
    ) -> None:
        """Shrink then expand, one call: out[t] += scales[s] * (x[t] @ lora_a[s]^T) @ lora_bt[s].
        The rank-r intermediate stays float32 in either dtype."""
        num_tokens, rank = x.shape[0], lora_a.shape[1]
        y = torch.empty(num_tokens * rank, dtype=torch.float32)
        scales = _float32(scales)
        self._apply[x.dtype](
            x.data_ptr(),
            x.stride(0),
            lora_a.data_ptr(),
            lora_a.stride(0),
            lora_a.stride(1),
            lora_bt.data_ptr(),
            lora_bt.stride(0),
            lora_bt.stride(1),
            scales.data_ptr(),
            out.data_ptr(),
            out.stride(0),
            slots.data_ptr(),
            num_tokens,
            rank,
            x.shape[1],
            out.shape[1],
            y.data_ptr(),
            torch.get_num_threads(),
        )

    def apply_modules(
        self,
        x: torch.Tensor,
        table,
        num_modules: int,
        rank: int,
        scales: torch.Tensor,
        out: torch.Tensor,
        slots: torch.Tensor,
        tile_rows: int = 0,
        tile_row_ranks: int = 0,
    ) -> int:
        """`apply` for every module of `table` (a ModuleStruct array, see lora_modules.py),
        each adding to its own columns of `out`, in one call. In bf16, runs of at least
        `tile_rows` rows of one slot (0: none) whose rows times the slot's own rank reach
        `tile_row_ranks` go through tiles (lora_tiles.h), their whole tiles of 16 rows;
        returns how many rows the tiles took."""
        num_tokens = x.shape[0]
        y = torch.empty(num_tokens * rank, dtype=torch.float32)
        return self._modules[x.dtype](
            x.data_ptr(),
            x.stride(0),
            table,
            num_modules,
            _float32(scales).data_ptr(),
            out.data_ptr(),
            out.stride(0),
            slots.data_ptr(),
            num_tokens,
            rank,
            x.shape[1],
            y.data_ptr(),
            torch.get_num_threads(),
            tile_rows,
            tile_row_ranks,
        )

    def row_shares(self, table, num_modules: int, slots: torch.Tensor, threads: int) -> list:
        """Where each of ``threads`` threads' shares of the (slot-sorted) rows begins, as
        ``apply_modules`` cuts them (lora_cpu.c: share_rows, the rows weighed by their
        slots' own ranks and the runs' first rows), and the end: ``threads + 1`` row
        indices."""
        shares = _function(self._library, "lora_share_rows", [_PTR, _I64, _PTR, _I64, _I64, _PTR])
        bounds = (ctypes.c_int64 * (threads + 1))()
        slots = slots.to(torch.int64).contiguous()
        shares(slots.data_ptr(), slots.shape[0], table, num_modules, threads, bounds)
        return list(bounds)


def _float32(scales: torch.Tensor) -> torch.Tensor:
    """The kernels read scales as contiguous float32 (the adapter slots keep them so)."""
    if scales.dtype == torch.float32 and scales.is_contiguous():
        return scales
    return scales.to(torch.float32).contiguous()


_lock = threading.Lock()
_state: dict[str, object] = {}


def native_lora() -> NativeLoRA | None:
    """The loaded kernels, building them on first use; None where they cannot be built."""
    if "kernels" not in _state:
        with _lock:
            if "kernels" not in _state:
                try:
                    _state["kernels"] = NativeLoRA(ctypes.CDLL(str(_native.build(_SOURCE))))
                except (OSError, subprocess.SubprocessError, AttributeError) as exc:
                    _state["kernels"] = None
                    _state["error"] = f"{type(exc).__name__}: {exc}"
                    log.warning("native CPU LoRA kernels unavailable, using torch: %s", exc)
    return _state["kernels"]  # type: ignore[return-value]


def native_lora_error() -> str | None:
    """Why the native kernels could not be loaded (None if they were, or were not tried)."""
    return _state.get("error")  # type: ignore[return-value]
