"""The native CPU LoRA kernels (lora_cpu.c), compiled once per machine and loaded with ctypes.

At decode sizes torch's grouped matmul costs ~10 us per adapter group per call, which made
16 adapters in a batch cost 20-30% of the base model's step; these per-token loops cost the
same whatever the number of adapters. The library is built with the system C compiler
(``$CC``, else ``cc``) into ``~/.cache/loragate/kernels`` (``LORAGATE_CACHE_DIR`` moves it),
keyed by the source, the flags and the CPU, on first use. No torch headers are needed, so
the build takes about a second. Where it cannot be built, ``native_lora()`` says why through
``native_lora_error()`` and the torch path runs instead.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import torch

from . import _backend

log = logging.getLogger(__name__)

_SOURCE = Path(__file__).with_name("lora_cpu.c")
_FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC")
_I64, _I32, _PTR = ctypes.c_int64, ctypes.c_int32, ctypes.c_void_p


class NativeLoRA:
    """float32 shrink / expand over per-token slots; rows with slot -1 are left to the base."""

    def __init__(self, library: ctypes.CDLL):
        self._shrink = library.lora_shrink_f32
        self._shrink.argtypes = [_PTR, _I64, _PTR, _I64, _I64, _PTR, _I64, _PTR, _I64, _I64, _I64]
        self._shrink.argtypes.append(_I32)
        self._shrink.restype = None
        self._expand = library.lora_expand_f32
        self._expand.argtypes = [_PTR, _I64, _PTR, _I64, _I64, _PTR, _PTR, _I64, _PTR, _I64]
        self._expand.argtypes += [_I64, _I64, _I32]
        self._expand.restype = None
        self._apply = library.lora_apply_f32
        self._apply.argtypes = [_PTR, _I64, _PTR, _I64, _I64, _PTR, _I64, _I64, _PTR, _PTR, _I64]
        self._apply.argtypes += [_PTR, _I64, _I64, _I64, _I64, _PTR, _I32]
        self._apply.restype = None

    @staticmethod
    def fits(*tensors: torch.Tensor) -> bool:
        """float32 CPU tensors whose last dimension is contiguous."""
        for t in tensors:
            if t.dtype != torch.float32 or t.is_cuda or t.stride(-1) != 1:
                return False
        return True

    def shrink(self, x: torch.Tensor, lora_a: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        """x [T, d_in], lora_a [S, r, d_in], slots [T] int64 -> y [T, r] (zeros where -1)."""
        num_tokens, rank = x.shape[0], lora_a.shape[1]
        y = _backend.empty_output((num_tokens, rank), x)
        self._shrink(
            x.data_ptr(), x.stride(0),
            lora_a.data_ptr(), lora_a.stride(0), lora_a.stride(1),
            y.data_ptr(), y.stride(0),
            slots.data_ptr(), num_tokens, rank, x.shape[1],
            torch.get_num_threads(),
        )  # fmt: skip
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
        self._expand(
            y.data_ptr(), y.stride(0),
            lora_bt.data_ptr(), lora_bt.stride(0), lora_bt.stride(1),
            scales.data_ptr(), out.data_ptr(), out.stride(0),
            slots.data_ptr(), y.shape[0], y.shape[1], out.shape[1],
            torch.get_num_threads(),
        )  # fmt: skip

    def apply(
        self,
        x: torch.Tensor,
        lora_a: torch.Tensor,
        lora_bt: torch.Tensor,
        scales: torch.Tensor,
        out: torch.Tensor,
        slots: torch.Tensor,
    ) -> None:
        """Shrink then expand, one call: out[t] += scales[s] * (x[t] @ lora_a[s]^T) @ lora_bt[s]."""
        num_tokens, rank = x.shape[0], lora_a.shape[1]
        y = torch.empty(num_tokens * rank, dtype=torch.float32)
        self._apply(
            x.data_ptr(), x.stride(0),
            lora_a.data_ptr(), lora_a.stride(0), lora_a.stride(1),
            lora_bt.data_ptr(), lora_bt.stride(0), lora_bt.stride(1),
            scales.data_ptr(), out.data_ptr(), out.stride(0),
            slots.data_ptr(), num_tokens, rank, x.shape[1], out.shape[1],
            y.data_ptr(), torch.get_num_threads(),
        )  # fmt: skip


_lock = threading.Lock()
_state: dict[str, object] = {}


def native_lora() -> NativeLoRA | None:
    """The loaded kernels, building them on first use; None where they cannot be built."""
    if "kernels" not in _state:
        with _lock:
            if "kernels" not in _state:
                try:
                    _state["kernels"] = NativeLoRA(ctypes.CDLL(str(_build())))
                except (OSError, subprocess.SubprocessError, AttributeError) as exc:
                    _state["kernels"] = None
                    _state["error"] = f"{type(exc).__name__}: {exc}"
                    log.warning("native CPU LoRA kernels unavailable, using torch: %s", exc)
    return _state["kernels"]  # type: ignore[return-value]


def native_lora_error() -> str | None:
    """Why the native kernels could not be loaded (None if they were, or were not tried)."""
    return _state.get("error")  # type: ignore[return-value]


def _build() -> Path:
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise OSError("no C compiler found (set CC)")
    source = _SOURCE.read_bytes()
    key = hashlib.sha256(source + " ".join((compiler, *_FLAGS, _cpu_id())).encode()).hexdigest()
    cache = Path(os.environ.get("LORAGATE_CACHE_DIR") or Path.home() / ".cache" / "loragate")
    target = cache / "kernels" / f"lora_cpu-{key[:16]}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        built = Path(tmp) / target.name
        result = subprocess.run(
            [compiler, *_FLAGS, str(_SOURCE), "-o", str(built)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if result.returncode != 0:
            raise OSError(f"{compiler} failed building {_SOURCE.name}: {result.stderr.strip()}")
        os.replace(built, target)  # atomic: concurrent builders never load half a file
    return target


def _cpu_id() -> str:
    """-march=native code runs only on CPUs like the one that built it."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine()
    lines = [ln for ln in info.splitlines() if ln.startswith(("model name", "flags"))]
    return "\n".join(dict.fromkeys(lines))
