"""Products with block-format weights (kernels/quant_blocks.py): x [rows, in] @ W^T in float32.

The activations stay float32 (never quantized, unlike llama.cpp's dot products): the result
is a float32 matmul against the dequantized weight, up to the order of the sums, which is
what HF transformers computes after loading the same GGUF file dequantized.

On the CPU, decode-sized calls (fewer than ``PANEL_ROWS`` rows) run the native kernel that
reads each block once and dequantizes it in registers: at batch 1 the bytes of the weights
read decide the time. Larger calls dequantize panels of output rows, each serving all the
rows: up to ``TORCH_PANEL_ROWS`` rows (on the vector path) a native kernel whose threads
each dequantize a panel small enough for L2 and multiply it four rows by three outputs at a
time; beyond, 8 MB panels (most weights whole) in a buffer the thread reuses, multiplied by
torch's float32 matmul. (One AVX2 EPYC core, SmolLM2's Q4_1 gate_up at 16 and 64 rows:
1.2 and 7.6 ms native, 3.1 and 11.6 through torch, 2.3 and 8.6 for float32 weights packed
for oneDNN.) Where the CPU has AVX-512 both native kernels run sixteen lanes (quant_cpu.py
chooses from its flags): on an AMD EPYC with AVX-512, one core, 1.5-2x the 8-lane path at
batch 1 and 1.2-1.5x on 16-64 row panels. On CUDA
the Triton kernel (kernels/quant_triton.py) dequantizes each group of weights in registers
inside the matmul; elsewhere (no native library) the torch reference dequantizes the weight
and multiplies.
"""

from __future__ import annotations

import threading
from dataclasses import replace

import torch
import torch.nn.functional as F

from . import _backend
from .quant_blocks import QuantizedWeight, StackedWeights
from .quant_cpu import native_quant, vector_path
from .quant_dequant import dequantize
from .quant_int8 import native_int8, takes_all_rows, takes_int8
from .quant_triton import quantized_matmul

PANEL_ROWS = 12  # from this many rows on, products run over dequantized panels (measured)
TORCH_PANEL_ROWS = 128  # and from this many, torch's matmul multiplies the panels
NATIVE_PANEL_BYTES = 192 << 10  # one thread's panel of the native path, kept in L2
PANEL_BYTES = 8 << 20  # float32 bytes of one panel (its output rows follow from in_features)


def quantized_linear(
    x: torch.Tensor,
    weight: QuantizedWeight | StackedWeights,
    bias: torch.Tensor | None = None,
    native: bool = True,
    backend: str | None = None,
) -> torch.Tensor:
    """``F.linear(x, dequantize(weight), bias)`` in float32, returned in x's dtype; x is
    [rows, in]. ``native=False`` runs the torch reference; ``backend`` as every op takes it
    (None: Triton on CUDA tensors, torch otherwise)."""
    if isinstance(weight, StackedWeights):
        return _stacked(x, weight, bias, native, backend)
    if weight.input_order is not None:  # act-order: x's columns in the blocks' order
        x = x.index_select(1, weight.input_order.to(x.device))
        weight = replace(weight, input_order=None)
    if _backend.resolve_backend(backend, x) == "triton":
        return quantized_matmul(x, weight, bias)
    m = x.shape[0]
    x32 = x if x.dtype == torch.float32 else x.float()
    if x32.stride(-1) != 1:
        x32 = x32.contiguous()
    b32 = None if bias is None else bias.float().contiguous()
    kernels = native_quant() if native and x.device.type == "cpu" else None
    if kernels is None:
        out = F.linear(x32, dequantize(weight).to(x.device), b32)
        return out if x.dtype == torch.float32 else out.to(x.dtype)
    out = _backend.empty_output((m, weight.out_features), x32)
    if m == 0:
        return out.to(x.dtype)
    vector = vector_path()
    if (
        weight.activations == "int8"
        and takes_int8(weight)
        and (m < PANEL_ROWS or takes_all_rows(weight))
    ):
        int8 = native_int8()
        if int8 is not None:
            int8.linear_rows(x32, weight, b32, out)
            return out if x.dtype == torch.float32 else out.to(x.dtype)
    if m < PANEL_ROWS:
        kernels.linear(x32, weight, b32, out, vector)
    elif vector and m < TORCH_PANEL_ROWS:
        rows = NATIVE_PANEL_BYTES // (4 * weight.in_features) // 3 * 3
        kernels.linear_panels(x32, weight, b32, out, max(12, min(48, rows)), vector)
    else:
        _panels(kernels, x32, weight, b32, out, vector)
    return out if x.dtype == torch.float32 else out.to(x.dtype)


_scratch = threading.local()


def _panel_buffer(rows: int, k: int) -> torch.Tensor:
    """A float32 [rows, k] buffer reused by the calling thread's calls (a fresh one per call
    would be mapped and faulted in every time: about a millisecond per 8 MB)."""
    held = getattr(_scratch, "buffer", None)
    if held is None or held.numel() < rows * k:
        held = _scratch.buffer = torch.empty(rows * k, dtype=torch.float32)
    return held[: rows * k].view(rows, k)


def held_panel_bytes() -> int:
    """Bytes of the panel buffer the calling thread holds (0 before its first panel): a
    working buffer, no weight, in the process's resident memory beside the weights."""
    held = getattr(_scratch, "buffer", None)
    return 0 if held is None else held.numel() * held.element_size()


def _panels(kernels, x, weight: QuantizedWeight, bias, out, vector: bool) -> None:
    """out = x @ W^T over panels of W's rows dequantized into one reused buffer: one panel
    for most weights (torch's matmul costs more per call than a dequantized panel does)."""
    n, k = weight.out_features, weight.in_features
    rows = max(16, min(n, PANEL_BYTES // (4 * k)))
    panel = _panel_buffer(rows, k)
    for start in range(0, n, rows):
        end = min(n, start + rows)
        part = QuantizedWeight(weight.blocks[start:end], weight.format, end - start, k)
        kernels.dequantize(part, panel, vector)
        b = None if bias is None else bias[start:end]
        out[:, start:end] = F.linear(x, panel[: end - start], b)


def _stacked(x, weight: StackedWeights, bias, native: bool, backend) -> torch.Tensor:
    """Each part's product into its own columns."""
    outs, start = [], 0
    for part in weight.parts:
        width = part.shape[0]
        b = None if bias is None else bias[start : start + width]
        if isinstance(part, QuantizedWeight):
            outs.append(quantized_linear(x, part, b, native, backend))
        else:
            outs.append(F.linear(x, part.to(x.dtype), None if b is None else b.to(x.dtype)))
        start += width
    return torch.cat(outs, dim=1)


def dequantized_rows(weight: QuantizedWeight, index: torch.Tensor, native: bool = True):
    """Rows ``index`` of the weight in float32 [len(index), in]: an embedding lookup that
    gathers blocks, then dequantizes only those rows."""
    rows = weight.rows(index.reshape(-1))
    kernels = native_quant() if native and rows.blocks.device.type == "cpu" else None
    if kernels is None or rows.input_order is not None:
        return dequantize(rows)
    out = _backend.empty_output((rows.out_features, rows.in_features), rows.blocks, torch.float32)
    if rows.out_features:
        kernels.dequantize(rows, out, vector_path())
    return out
