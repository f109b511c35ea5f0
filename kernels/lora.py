"""Batched multi-LoRA (Punica's SGMV/BGMV): every token applies its own adapter's A and B.

A LoRA-targeted linear computes base(x) + scale[s] * (x @ A[s]^T) @ B[s]^T for the token's
slot s; lora_shrink does the first product, lora_expand the second and the in-place add.
"""

import torch

from ._backend import require, resolve_backend
from .lora_groups import LoraIndex, lora_index
from .lora_torch import apply_torch, expand_torch, shrink_torch


def lora_shrink(
    x: torch.Tensor,
    lora_a: torch.Tensor,
    slot_ids: torch.Tensor,
    backend: str | None = None,
    index: LoraIndex | None = None,
) -> torch.Tensor:
    """y[t] = x[t] @ lora_a[slot_ids[t]]^T, or zeros where slot_ids[t] is -1.

    x [T, d_in], lora_a [S, r, d_in] (may be a view such as lora_a[:, :r_eff]), slot_ids [T].
    index: optional `lora_index(slot_ids, S)` computed once per forward pass and shared by every
    call of that pass; built here when omitted. Returns y [T, r] in lora_a's dtype.
    """
    require(x.dim() == 2, lambda: f"x must be [T, d_in], got shape {tuple(x.shape)}")
    require(
        lora_a.dim() == 3, lambda: f"lora_a must be [S, r, d_in], got shape {tuple(lora_a.shape)}"
    )
    require(
        lora_a.shape[2] == x.shape[1],
        lambda: f"lora_a d_in {lora_a.shape[2]} != x d_in {x.shape[1]}",
    )
    index = _checked_index(index, slot_ids, x.shape[0], lora_a.shape[0])
    if _use_triton(backend, x, index):
        from .lora_triton import shrink_triton

        return shrink_triton(x, lora_a, index)
    return shrink_torch(x, lora_a, index)


def lora_expand(
    y: torch.Tensor,
    lora_b: torch.Tensor,
    slot_ids: torch.Tensor,
    scales: torch.Tensor,
    out: torch.Tensor,
    backend: str | None = None,
    index: LoraIndex | None = None,
) -> None:
    """out[t] += scales[s] * y[t] @ lora_b[s]^T with s = slot_ids[t]; rows with -1 untouched.

    y [T, r], lora_b [S, d_out, r] (may be a view such as lora_b[:, :, :r_eff]), scales [S],
    out [T, d_out] updated in place; out may be a strided view (a column slice of a fused qkv
    or gate_up output). index: as for lora_shrink.
    """
    require(y.dim() == 2, lambda: f"y must be [T, r], got shape {tuple(y.shape)}")
    require(
        lora_b.dim() == 3, lambda: f"lora_b must be [S, d_out, r], got shape {tuple(lora_b.shape)}"
    )
    require(
        lora_b.shape[2] == y.shape[1],
        lambda: f"lora_b rank {lora_b.shape[2]} != y rank {y.shape[1]}",
    )
    _require_output(out, scales, lora_b, y.shape[0])
    index = _checked_index(index, slot_ids, y.shape[0], lora_b.shape[0])
    if _use_triton(backend, y, index):
        from .lora_triton import expand_triton

        expand_triton(y, lora_b, scales, out, index)
    else:
        expand_torch(y, lora_b, scales, out, index)


def lora_apply(
    x: torch.Tensor,
    lora_a: torch.Tensor,
    lora_b: torch.Tensor,
    slot_ids: torch.Tensor,
    scales: torch.Tensor,
    out: torch.Tensor,
    backend: str | None = None,
    index: LoraIndex | None = None,
) -> None:
    """out[t] += scales[s] * (x[t] @ lora_a[s]^T) @ lora_b[s]^T: lora_shrink then lora_expand.

    What a LoRA-targeted linear layer adds, in one call: the engine makes one per module group
    and layer, so checking the shapes once and, on the CPU, running both halves in one native
    call keep the per-call cost small. Shapes as for lora_shrink and lora_expand.
    """
    require(x.dim() == 2, lambda: f"x must be [T, d_in], got shape {tuple(x.shape)}")
    require(
        lora_a.dim() == 3 and lora_b.dim() == 3,
        lambda: f"lora_a and lora_b must be 3-D, got {tuple(lora_a.shape)} {tuple(lora_b.shape)}",
    )
    num_slots, rank = lora_a.shape[0], lora_a.shape[1]
    require(
        lora_a.shape[2] == x.shape[1],
        lambda: f"lora_a d_in {lora_a.shape[2]} != x d_in {x.shape[1]}",
    )
    require(
        lora_b.shape[0] == num_slots and lora_b.shape[2] == rank,
        lambda: f"lora_b {tuple(lora_b.shape)} does not match lora_a {tuple(lora_a.shape)}",
    )
    _require_output(out, scales, lora_b, x.shape[0])
    index = _checked_index(index, slot_ids, x.shape[0], num_slots)
    if _use_triton(backend, x, index):
        from .lora_triton import expand_triton, shrink_triton

        expand_triton(shrink_triton(x, lora_a, index), lora_b, scales, out, index)
    else:
        apply_torch(x, lora_a, lora_b, scales, out, index)


def _require_output(
    out: torch.Tensor, scales: torch.Tensor, lora_b: torch.Tensor, num_tokens: int
) -> None:
    """The expand side's contract: out [T, d_out] and one scale per slot of lora_b."""
    require(
        out.dim() == 2 and out.shape == (num_tokens, lora_b.shape[1]),
        lambda: f"out must be [T={num_tokens}, d_out={lora_b.shape[1]}], got {tuple(out.shape)}",
    )
    require(
        scales.shape == (lora_b.shape[0],),
        lambda: f"scales must be [S={lora_b.shape[0]}], got {tuple(scales.shape)}",
    )


def _checked_index(
    index: LoraIndex | None, slot_ids: torch.Tensor, num_tokens: int, num_slots: int
) -> LoraIndex:
    require(
        slot_ids.shape == (num_tokens,),
        lambda: f"slot_ids must be [T={num_tokens}], got {tuple(slot_ids.shape)}",
    )
    if index is None:
        return lora_index(slot_ids, num_slots)
    require(
        index.num_tokens == num_tokens and index.num_slots == num_slots,
        lambda: (
            f"index was built for {index.num_tokens} tokens / {index.num_slots} slots, "
            f"call has {num_tokens} / {num_slots}"
        ),
    )
    return index


def _use_triton(backend: str | None, tensor: torch.Tensor, index: LoraIndex) -> bool:
    triton = resolve_backend(backend, tensor) == "triton"
    require(
        triton or not index.static,
        "a static LoRA index (static_lora_index) drives the Triton kernels only; "
        "the torch backend needs lora_index",
    )
    return triton
