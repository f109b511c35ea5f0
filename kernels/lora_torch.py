"""Torch backend of batched LoRA: tokens grouped by slot, one grouped matmul per call.

Cost stays flat in the number of distinct adapters: no Python loop over slots and no per-token
copy of adapter weights. Measured on 2 CPU cores this beat a gather + bmm (per-token weight
copies) by 5-50x and a dense product over every slot (S times the FLOPs) by 2-10x; see the
kernels report in BENCHMARKS.md. Each ATen op costs a few microseconds at decode sizes, so the
paths below avoid every op they can (identity order, single slot, the used slot window).
"""

import torch

from .lora_index import LoraIndex


def shrink_torch(x: torch.Tensor, lora_a: torch.Tensor, index: LoraIndex) -> torch.Tensor:
    num_tokens, rank = x.shape[0], lora_a.shape[1]
    x = x.to(lora_a.dtype)
    active = index.num_active
    if active == 0:
        return x.new_zeros(num_tokens, rank)
    all_active = active == num_tokens
    rows = index.order[:active]
    if index.single_slot is not None:
        weight = lora_a[index.single_slot].T
        if all_active:
            return x @ weight
        grouped = x.index_select(0, rows) @ weight
    else:
        grouped = x if index.is_identity else x.index_select(0, rows)
        grouped = _grouped_matmul(grouped, lora_a.transpose(1, 2), index)
        if index.is_identity:
            return grouped
    return x.new_zeros(num_tokens, rank).index_copy_(0, rows, grouped)


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
    rows = index.order[:active]
    all_active = active == y.shape[0]
    slot = index.single_slot
    if slot is not None:
        grouped = y if all_active else y.index_select(0, rows)
        delta = grouped @ lora_b[slot].T
        alpha = float(scales[slot])
        if all_active:
            out.add_(delta.to(out.dtype), alpha=alpha)
        else:
            out.index_add_(0, rows, delta.to(out.dtype), alpha=alpha)
        return
    grouped = y if index.is_identity else y.index_select(0, rows)
    # Scaling the rank-r side costs r/d_out of scaling the output.
    grouped = grouped * scales.to(y.dtype)[index.sorted_slots[:active]].unsqueeze(1)
    delta = _grouped_matmul(grouped, lora_b.transpose(1, 2), index).to(out.dtype)
    if index.is_identity:
        out.add_(delta)
    else:
        out.index_add_(0, rows, delta)


def _grouped_matmul(a: torch.Tensor, w: torch.Tensor, index: LoraIndex) -> torch.Tensor:
    """a [active, K] sorted by slot times w[slot] [K, N] -> [active, N].

    Only the window of slots first_slot..last_slot is passed on: torch's grouped matmul visits
    every group, empty ones included, at about a microsecond each.
    """
    first, last = index.first_slot, index.last_slot + 1
    if _grouped_mm_fits(a):
        return torch._grouped_mm(a, w[first:last], offs=index.group_ends[first:last])
    per_token = w.index_select(0, index.sorted_slots[: a.shape[0]])
    return torch.bmm(a.unsqueeze(1), per_token).squeeze(1)


def _grouped_mm_fits(a: torch.Tensor) -> bool:
    return hasattr(torch, "_grouped_mm") and a.device.type == "cpu" and a.dtype == torch.float32
