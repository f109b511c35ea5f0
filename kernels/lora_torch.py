"""Torch backend of batched LoRA: tokens grouped by slot, one grouped matmul per call, or
for decode-sized float32 / bfloat16 batches over several slots the native per-token kernels
(lora_cpu.py), which pay nothing per slot.

No Python loop over slots and no per-token copy of adapter weights: each adapter's weights are
read once per call. Measured on this project's 2-core CPU over T 1-256 tokens, 1-16 slots and
ranks 8-64, a gather + bmm (per-token weight copies) was 2-150x slower and a dense product over
every slot (S times the FLOPs) 1.1-10x slower; a grouped matmul still pays a few microseconds
per slot in use, which is why the batch-level index is built once per pass. At decode sizes
each ATen op costs microseconds, so the paths below skip every op they can: no
gather/scatter when the batch is already grouped by slot (the engine sorts it so), a plain
matmul when one slot serves every active token, only the window of slots in use.
"""

import torch
import torch.nn.functional as F

from .lora_cpu import NativeLoRA, native_lora
from .lora_groups import LoraIndex

# Above this many tokens (long prefills) the grouped matmul's BLAS calls win. Measured on 2
# cores (EPYC with AVX512-BF16, 2026-11-26, since the native loops take two tokens of a slot
# at once and bf16 pairs by vdpbf16ps), a q/k/v call over 16 slots: at 600 tokens native
# 0.4-2.7 ms against 1.4-3.1 (float32, ranks 8-64) and 0.2-1.3 against 6.6-89 (bf16: torch's
# grouped matmul is slow there); at 2048 tokens native ahead but for float32 rank 64 (9.1
# ms against 7.8).
NATIVE_MAX_TOKENS = 2048
# One slot for every active token: up to this many of them the native loops beat one BLAS
# matmul (same machine and call: at 16 tokens 0.1 against 0.2 ms, at 128 even in float32 and
# native ahead in bf16, at 600 BLAS ahead in float32 rank 64, 1.7 against 2.4 ms). Where the
# CPU has a split rule for the dtype (lora_segment_gemm.gemm_min_rows), the native path takes
# such batches whole and its rule sends the long runs to products: on the Xeon with AMX, a
# rank-8 warm adapter's 256-token prompt spent 79 ms in LoRA on the grouped matmuls (oneDNN's
# cost per small product), 35 ms on the native loop (benchmarks/first_token.py, bf16).
NATIVE_MAX_SINGLE_SLOT_TOKENS = 128


def _native(
    index: LoraIndex, *tensors: torch.Tensor, splits_long_runs: bool = False
) -> NativeLoRA | None:
    """The native per-token kernels, where they serve this call better than a grouped matmul:
    several slots in use or a few tokens on one, decode-sized batches, float32 or bfloat16
    tensors with contiguous rows (scales, read as float32, are not among `tensors`). A caller
    that `splits_long_runs` (lora_segment_gemm.py: long runs of one slot go to products by
    this CPU's measured rule) takes one slot's tokens however many, up to NATIVE_MAX_TOKENS."""
    if index.num_tokens > NATIVE_MAX_TOKENS:
        return None
    if (
        not splits_long_runs
        and index.single_slot is not None
        and index.num_active > NATIVE_MAX_SINGLE_SLOT_TOKENS
    ):
        return None
    if not (NativeLoRA.fits(*tensors) and index.slot_ids.is_contiguous()):
        return None
    return native_lora()


def shrink_torch(x: torch.Tensor, lora_a: torch.Tensor, index: LoraIndex) -> torch.Tensor:
    num_tokens, rank = x.shape[0], lora_a.shape[1]
    x = x.to(lora_a.dtype)
    active = index.num_active
    if active == 0:
        return x.new_zeros(num_tokens, rank)
    native = _native(index, x, lora_a)
    if native is not None:
        return native.shrink(x, lora_a, index.slot_ids)
    if index.is_sorted:
        # Active tokens are the first rows: work on that prefix, pad the base-only rest.
        y = _slot_matmul(x[:active], lora_a.transpose(1, 2), index)
        return y if active == num_tokens else F.pad(y, (0, 0, 0, num_tokens - active))
    grouped = _slot_matmul(x.index_select(0, index.active_rows), lora_a.transpose(1, 2), index)
    return x.new_zeros(num_tokens, rank).index_copy_(0, index.active_rows, grouped)


def expand_torch(
    y: torch.Tensor,
    lora_b: torch.Tensor,
    scales: torch.Tensor,
    out: torch.Tensor,
    index: LoraIndex,
) -> None:
    active = index.num_active
    if active == 0:
        return
    y = y.to(lora_b.dtype)
    native = _native(index, y, lora_b.transpose(1, 2), out)
    if native is not None:
        native.expand(y, lora_b.transpose(1, 2), scales, out, index.slot_ids)
        return
    rows = y[:active] if index.is_sorted else y.index_select(0, index.active_rows)
    slot = index.single_slot
    if slot is not None:
        alpha = float(scales[slot])
        if index.is_sorted and out.dtype == y.dtype:
            out[:active].addmm_(rows, lora_b[slot].T, alpha=alpha)
            return
        delta = rows @ lora_b[slot].T
    else:
        # Scaling the rank-r side costs r/d_out of scaling the output.
        rows = rows * scales.to(y.dtype).index_select(0, index.active_slots).unsqueeze(1)
        delta = _grouped_matmul(rows, lora_b.transpose(1, 2), index)
        alpha = 1.0
    if index.is_sorted:
        out[:active].add_(delta.to(out.dtype), alpha=alpha)
    else:
        out.index_add_(0, index.active_rows, delta.to(out.dtype), alpha=alpha)


def _slot_matmul(rows: torch.Tensor, w: torch.Tensor, index: LoraIndex) -> torch.Tensor:
    """rows [active, K] grouped by slot times w[slot] [K, N]: one matmul for a single slot."""
    slot = index.single_slot
    return rows @ w[slot] if slot is not None else _grouped_matmul(rows, w, index)


def apply_torch(
    x: torch.Tensor,
    lora_a: torch.Tensor,
    lora_b: torch.Tensor,
    scales: torch.Tensor,
    out: torch.Tensor,
    index: LoraIndex,
) -> None:
    """shrink then expand; one native call where the native kernels serve the batch."""
    if index.num_active == 0:
        return
    native = _native(index, x, lora_a, lora_b.transpose(1, 2), out)
    if native is not None:
        native.apply(x, lora_a, lora_b.transpose(1, 2), scales, out, index.slot_ids)
        return
    expand_torch(shrink_torch(x, lora_a, index), lora_b, scales, out, index)


def _grouped_matmul(a: torch.Tensor, w: torch.Tensor, index: LoraIndex) -> torch.Tensor:
    """a [active, K] sorted by slot times w[slot] [K, N] -> [active, N].

    Only the window of slots first_slot..last_slot is passed on: torch's grouped matmul visits
    every group, empty ones included, at about a microsecond each.
    """
    if _grouped_mm_fits(a, w):
        window = w[index.first_slot : index.last_slot + 1]
        return torch._grouped_mm(a, window, offs=index.window_ends)
    per_token = w.index_select(0, index.active_slots)
    return torch.bmm(a.unsqueeze(1), per_token).squeeze(1)


def _grouped_mm_fits(a: torch.Tensor, w: torch.Tensor) -> bool:
    """torch's grouped matmul wants every non-unit stride and base address 16-byte aligned
    (an odd rank such as 6 in fp32 is not); otherwise the bmm path runs."""
    if not (hasattr(torch, "_grouped_mm") and a.device.type == "cpu" and a.dtype == torch.float32):
        return False
    for t in (a, w):
        if t.data_ptr() % 16 or any(st % 4 for st in t.stride() if st != 1):
            return False
    return True
