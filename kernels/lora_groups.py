"""Per-forward-pass bookkeeping for batched LoRA: the batch's tokens grouped by adapter slot.

The engine builds one LoraIndex per forward pass with `lora_index(slot_ids, num_slots)` and
passes it to every lora_shrink / lora_expand call of that pass (7 projections x every layer),
so the sort, the segment offsets and the few host-side scalars are computed once, not 200+ times.
"""

from dataclasses import dataclass, field

import torch

from ._backend import require


@dataclass(frozen=True)
class LoraIndex:
    """Tokens sorted by slot (stable); tokens without an adapter (slot < 0) sort last.

    slot_ids:     [T] int64, the slots as given.
    order:        [T] int64, token indices grouped by slot; the first num_active have a slot.
    sorted_slots: [T] int64, slot_ids[order].
    group_ends:   [S] int32, cumulative token count per slot: slot s owns sorted rows
                  group_ends[s-1]:group_ends[s] (the `offs` of a grouped matmul).
    num_active:   tokens that have an adapter.
    first_slot, last_slot: lowest and highest slot in use (-1 when none is), so the torch path
                  only visits the slots between them.
    is_sorted:    the tokens are already grouped by slot, base-only ones last: the active
                  tokens are rows 0..num_active-1, so no gather or scatter is needed.
    is_identity:  is_sorted and every token has a slot.
    active_rows, active_slots: order and sorted_slots cut to the num_active tokens with a slot.
    window_ends:  group_ends[first_slot : last_slot + 1].
    static:       host-side fields fixed in advance (static_lora_index), not read off the batch.
    derived:      what a kernel path works out from the index once per pass and keeps here
                  (lora_segment_gemm.long_segments), keyed by that path.
    """

    slot_ids: torch.Tensor
    order: torch.Tensor
    sorted_slots: torch.Tensor
    group_ends: torch.Tensor
    num_slots: int
    num_active: int
    first_slot: int
    last_slot: int
    is_sorted: bool
    is_identity: bool
    active_rows: torch.Tensor
    active_slots: torch.Tensor
    window_ends: torch.Tensor
    static: bool = False  # built by static_lora_index: for the Triton kernels only
    derived: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def num_tokens(self) -> int:
        return self.slot_ids.shape[0]

    @property
    def single_slot(self) -> int | None:
        """The one slot every active token uses, or None when they use several (or none)."""
        return self.first_slot if self.num_active and self.first_slot == self.last_slot else None


def lora_index(slot_ids: torch.Tensor, num_slots: int) -> LoraIndex:
    """Group the batch's tokens by adapter slot (-1 = base model only).

    Reads four scalars back to the host (one sync per forward pass on a GPU, rather than one
    per LoRA call). Sorting the batch by slot beforehand, base-only tokens last, makes every
    LoRA call skip its gather and scatter (is_sorted).
    """
    require(
        slot_ids.dim() == 1, lambda: f"slot_ids must be 1-D [T], got shape {tuple(slot_ids.shape)}"
    )
    require(num_slots >= 1, lambda: f"num_slots must be >= 1, got {num_slots}")
    require(
        not slot_ids.is_floating_point()
        and not slot_ids.is_complex()
        and slot_ids.dtype != torch.bool,
        lambda: f"slot_ids must be an integer tensor, got {slot_ids.dtype}",
    )
    slots = slot_ids.long()
    active = slots >= 0
    keys = torch.where(active, slots, num_slots)
    order = torch.sort(keys, stable=True).indices
    counts = torch.bincount(keys, minlength=num_slots + 1)
    positions = torch.arange(order.shape[0], device=order.device)
    sentinel = slots.new_full((1,), -1)
    # One host read for all four scalars; the sentinels cover a batch with no active token.
    stats = torch.cat(
        [
            counts[num_slots : num_slots + 1],
            torch.cat([keys, sentinel + num_slots + 1]).min(0, keepdim=True).values,
            torch.cat([torch.where(active, slots, -1), sentinel]).max(0, keepdim=True).values,
            (order != positions).sum(0, keepdim=True),
        ]
    ).tolist()
    num_inactive, first_slot, last_slot, moved = stats
    require(
        last_slot < num_slots, lambda: f"slot id {last_slot} out of range for {num_slots} slots"
    )
    num_active = slots.shape[0] - num_inactive
    sorted_slots = slots[order]
    group_ends = torch.cumsum(counts[:num_slots], 0).to(torch.int32)
    if not num_active:
        first_slot = last_slot = -1
    return LoraIndex(
        slot_ids=slots,
        order=order,
        sorted_slots=sorted_slots,
        group_ends=group_ends,
        num_slots=num_slots,
        num_active=num_active,
        first_slot=first_slot,
        last_slot=last_slot,
        is_sorted=moved == 0,
        is_identity=num_inactive == 0 and moved == 0,
        active_rows=order[:num_active],
        active_slots=sorted_slots[:num_active],
        window_ends=group_ends[max(first_slot, 0) : last_slot + 1],
    )


def static_lora_index(
    slot_ids: torch.Tensor, group_ends: torch.Tensor, num_slots: int
) -> LoraIndex:
    """An index whose host-side fields do not depend on the batch, for CUDA graphs.

    The caller groups the tokens by slot (base-only tokens last) and writes each slot's
    cumulative token count into `group_ends` [num_slots] int32 itself. Every slot is then
    visited (empty ones exit at once), so the Triton launches read nothing back to the host
    and a graph captured once replays correctly after new slot_ids and group_ends are
    written in place. The torch backend, which reads counts on the host, refuses it.
    """
    require(
        slot_ids.dim() == 1, lambda: f"slot_ids must be 1-D [T], got shape {tuple(slot_ids.shape)}"
    )
    require(
        group_ends.shape == (num_slots,) and group_ends.dtype == torch.int32,
        lambda: (
            f"group_ends must be int32 [{num_slots}], got {group_ends.dtype} "
            f"{tuple(group_ends.shape)}"
        ),
    )
    order = torch.arange(slot_ids.shape[0], device=slot_ids.device)
    return LoraIndex(
        slot_ids=slot_ids,
        order=order,
        sorted_slots=slot_ids,
        group_ends=group_ends,
        num_slots=num_slots,
        num_active=slot_ids.shape[0],
        first_slot=0,
        last_slot=num_slots - 1,
        is_sorted=True,
        is_identity=False,
        active_rows=order,
        active_slots=slot_ids,
        window_ends=group_ends,
        static=True,
    )
