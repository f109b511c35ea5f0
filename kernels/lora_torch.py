"""Torch backend of batched LoRA: tokens grouped by slot, one grouped matmul per call.

Cost stays flat in the number of distinct adapters: no Python loop over slots, no per-token
copy of adapter weights (torch._grouped_mm on CPU float32; a gather + bmm elsewhere).
"""

import torch

from .lora_index import LoraIndex


def shrink_torch(x: torch.Tensor, lora_a: torch.Tensor, index: LoraIndex) -> torch.Tensor:
    num_tokens, rank = x.shape[0], lora_a.shape[1]
    x = x.to(lora_a.dtype)
    if index.single_slot is not None:
        return x @ lora_a[index.single_slot].T
    active = index.num_active
    if active == 0:
        return x.new_zeros(num_tokens, rank)
    rows = index.order[:active]
    grouped = x if index.is_identity else x.index_select(0, rows)
    y_grouped = _grouped_matmul(grouped, lora_a.transpose(1, 2), index)
    if index.is_identity:
        return y_grouped
    return x.new_zeros(num_tokens, rank).index_copy_(0, rows, y_grouped)


def expand_torch(
    y: torch.Tensor,
    lora_b: torch.Tensor,
    scales: torch.Tensor,
    out: torch.Tensor,
    index: LoraIndex,
) -> None:
    y = y.to(lora_b.dtype)
    if index.single_slot is not None:
        slot = index.single_slot
        delta = y @ lora_b[slot].T
        out.add_(delta.to(out.dtype), alpha=float(scales[slot]))
        return
    active = index.num_active
    if active == 0:
        return
    rows = index.order[:active]
    grouped = y if index.is_identity else y.index_select(0, rows)
    # Scaling the rank-r side is r/d_out times cheaper than scaling the output.
    grouped = grouped * scales.to(y.dtype)[index.sorted_slots[:active]].unsqueeze(1)
    delta = _grouped_matmul(grouped, lora_b.transpose(1, 2), index).to(out.dtype)
    if index.is_identity:
        out.add_(delta)
    else:
        out.index_add_(0, rows, delta)


def _grouped_matmul(a: torch.Tensor, w: torch.Tensor, index: LoraIndex) -> torch.Tensor:
    """a [n, K] sorted by slot (n = active tokens) times w[slot] [K, N] -> [n, N]."""
    if _grouped_mm_fits(a):
        return torch._grouped_mm(a, w, offs=index.group_ends)
    per_token = w.index_select(0, index.sorted_slots[: a.shape[0]])
    return torch.bmm(a.unsqueeze(1), per_token).squeeze(1)


def _grouped_mm_fits(a: torch.Tensor) -> bool:
    return hasattr(torch, "_grouped_mm") and a.device.type == "cpu" and a.dtype == torch.float32
