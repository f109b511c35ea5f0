"""Torch backend of batched LoRA: tokens grouped by slot, one grouped matmul per call.

No Python loop over slots and no per-token copy of adapter weights: each adapter's weights are
read once per call. Measured on this project's 2-core CPU over T 1-256 tokens, 1-16 slots and
ranks 8-64, a gather + bmm (per-token weight copies) was 2-150x slower and a dense product over
every slot (S times the FLOPs) 1.1-10x slower; a grouped matmul still pays a few microseconds
per slot in use, which is why the batch-level index is built once per pass. At decode sizes
each ATen op costs microseconds, so the paths below
skip every op they can: no gather/scatter when the batch is already grouped by slot, a plain
matmul when one slot serves every active token, only the window of slots in use.
"""

import torch

from .lora_groups import LoraIndex


def shrink_torch(x: torch.Tensor, lora_a: torch.Tensor, index: LoraIndex) -> torch.Tensor:
    num_tokens, rank = x.shape[0], lora_a.shape[1]
    x = x.to(lora_a.dtype)
    active = index.num_active
    if active == 0:
        return x.new_zeros(num_tokens, rank)
    slot = index.single_slot
    if slot is not None and active == num_tokens:
        return x @ lora_a[slot].T
    if index.is_identity:
        return _grouped_matmul(x, lora_a.transpose(1, 2), index)
    grouped = x.index_select(0, index.active_rows)
    if slot is not None:
        grouped = grouped @ lora_a[slot].T
    else:
        grouped = _grouped_matmul(grouped, lora_a.transpose(1, 2), index)
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
    slot = index.single_slot
    if slot is not None:
        alpha = float(scales[slot])
        if active == y.shape[0] and out.dtype == y.dtype:
            out.addmm_(y, lora_b[slot].T, alpha=alpha)
            return
        delta = y.index_select(0, index.active_rows) @ lora_b[slot].T
        out.index_add_(0, index.active_rows, delta.to(out.dtype), alpha=alpha)
        return
    grouped = y if index.is_identity else y.index_select(0, index.active_rows)
    # Scaling the rank-r side costs r/d_out of scaling the output.
    grouped = grouped * scales.to(y.dtype).index_select(0, index.active_slots).unsqueeze(1)
    delta = _grouped_matmul(grouped, lora_b.transpose(1, 2), index).to(out.dtype)
    if index.is_identity:
        out.add_(delta)
    else:
        out.index_add_(0, index.active_rows, delta)


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
