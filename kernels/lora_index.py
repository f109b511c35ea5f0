"""Per-forward-pass bookkeeping for batched LoRA: tokens grouped by adapter slot.

The engine builds one LoraIndex per forward pass with `lora_index(slot_ids, num_slots)` and
hands it to every lora_shrink / lora_expand call of that pass (7 projections x every layer), so
the sort and the segment offsets are computed once rather than 200+ times.
"""

from dataclasses import dataclass

import torch

from ._backend import require


@dataclass(frozen=True)
class LoraIndex:
    """Tokens sorted by slot (stable); tokens without an adapter (-1) sort last.

    slot_ids:    [T] int64, the slots as given.
    order:       [T] int64, token indices grouped by slot; the first num_active have a slot.
    sorted_slots:[T] int64, slot_ids[order] (the inactive tail holds -1).
    group_ends:  [S] int32, cumulative token count per slot: slot s owns sorted rows
                 group_ends[s-1]:group_ends[s] (the `offs` of torch's grouped matmul).
    num_active:  tokens that have an adapter.
    is_identity: order is 0..T-1 and every token has a slot, so no gather/scatter is needed.
    single_slot: the one slot every token uses, or None when tokens are mixed or some lack one.
    """

    slot_ids: torch.Tensor
    order: torch.Tensor
    sorted_slots: torch.Tensor
    group_ends: torch.Tensor
    num_slots: int
    num_active: int
    is_identity: bool
    single_slot: int | None

    @property
    def num_tokens(self) -> int:
        return self.slot_ids.shape[0]


def lora_index(slot_ids: torch.Tensor, num_slots: int) -> LoraIndex:
    """Group the batch's tokens by adapter slot (-1 = base model only).

    Reads a few scalars back to the host once (the active count and two flags), which on a GPU
    is one sync per forward pass instead of one per LoRA call.
    """
    require(slot_ids.dim() == 1, f"slot_ids must be 1-D [T], got shape {tuple(slot_ids.shape)}")
    require(num_slots >= 1, f"num_slots must be >= 1, got {num_slots}")
    require(
        not slot_ids.is_floating_point() and not slot_ids.is_complex(),
        f"slot_ids must be an integer tensor, got {slot_ids.dtype}",
    )
    slots = slot_ids.long()
    keys = torch.where(slots < 0, num_slots, slots)
    order = torch.sort(keys, stable=True).indices
    sorted_slots = slots[order]
    counts = torch.bincount(keys, minlength=num_slots + 1)
    group_ends = torch.cumsum(counts[:num_slots], 0).to(torch.int32)
    stats = torch.stack(
        [
            counts[num_slots],
            slots.max() if slots.numel() else slots.new_tensor(-1),
            slots.min() if slots.numel() else slots.new_tensor(-1),
            (order != torch.arange(order.numel(), device=order.device)).sum(),
        ]
    ).tolist()
    num_inactive, highest, lowest, moved = stats
    require(highest < num_slots, f"slot id {highest} out of range for {num_slots} slots")
    num_tokens = slots.shape[0]
    return LoraIndex(
        slot_ids=slots,
        order=order,
        sorted_slots=sorted_slots,
        group_ends=group_ends,
        num_slots=num_slots,
        num_active=num_tokens - num_inactive,
        is_identity=num_inactive == 0 and moved == 0,
        single_slot=lowest if num_inactive == 0 and lowest == highest and num_tokens else None,
    )
