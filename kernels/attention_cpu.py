"""The native CPU paged decode attention (attention_cpu.c), loaded with ctypes.

The torch version gathers every sequence's blocks into a padded copy (index_select), runs two
batched matmuls and a masked softmax: about a quarter of a float32 decode step at 64
sequences. The native one reads K/V in place through the block table, one online-softmax pass,
float32 sums over float32 or bfloat16 caches. Where it cannot be built the torch version runs
(``native_attention_error()`` says why).
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from . import _backend, _native

_I64, _I32, _PTR, _F32 = ctypes.c_int64, ctypes.c_int32, ctypes.c_void_p, ctypes.c_float
_SUFFIX = {torch.float32: "f32", torch.bfloat16: "bf16"}
_ARGS = [_PTR, _I64, _I64, _PTR, _PTR, _I64, _I64, _I64, _PTR, _I64, _PTR, _PTR, _I64, _I64]
_ARGS += [_I64, _I64, _I64, _I64, _I64, _F32, _I64, _I32]


class NativeAttention:
    def __init__(self, library: ctypes.CDLL):
        self._decode = {}
        for dtype, suffix in _SUFFIX.items():
            function = getattr(library, f"paged_decode_{suffix}")
            function.argtypes, function.restype = _ARGS, None
            self._decode[dtype] = function

    @staticmethod
    def fits(q, k_cache, v_cache, block_tables, seq_lens) -> bool:
        """CPU tensors, q and caches of one dtype the kernel takes, contiguous head rows, the
        two caches laid out alike, int32 tables and lengths with unit inner stride."""
        dtype = q.dtype
        return (
            dtype in _SUFFIX
            and k_cache.dtype == dtype == v_cache.dtype
            and not q.is_cuda
            and not k_cache.is_cuda
            and q.stride(2) == 1
            and k_cache.stride() == v_cache.stride()
            and k_cache.stride(3) == 1
            and block_tables.dtype == torch.int32 == seq_lens.dtype
            and block_tables.stride(1) == 1
            and seq_lens.is_contiguous()
            and not block_tables.is_cuda
        )

    def decode(
        self, q, k_cache, v_cache, block_tables, seq_lens, scale: float, window: int = 0
    ) -> torch.Tensor:
        """window > 0: each query sees only the last ``window`` positions of its context."""
        batch, heads, head_dim = q.shape
        out = _backend.empty_output((batch, heads, head_dim), q)
        self._decode[q.dtype](
            q.data_ptr(),
            q.stride(0),
            q.stride(1),
            k_cache.data_ptr(),
            v_cache.data_ptr(),
            k_cache.stride(0),
            k_cache.stride(1),
            k_cache.stride(2),
            block_tables.data_ptr(),
            block_tables.stride(0),
            seq_lens.data_ptr(),
            out.data_ptr(),
            out.stride(0),
            out.stride(1),
            batch,
            heads,
            k_cache.shape[2],
            head_dim,
            k_cache.shape[1],
            scale,
            window,
            torch.get_num_threads(),
        )
        return out


_library = _native.Loaded(Path(__file__).with_name("attention_cpu.c"), NativeAttention)


def native_attention() -> NativeAttention | None:
    """The loaded kernel, building it on first use; None where it cannot be built."""
    return _library.get()


def native_attention_error() -> str | None:
    return _library.error()
