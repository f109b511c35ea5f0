"""Weights into loragate's integer formats (kernels/quant_blocks.py: I8_CH, I4_G*).

- ``quantize_int8``: a float weight, int8 symmetric per output channel (vLLM's on-the-fly
  int8): d = max|w| / 127 per row, q = round(w / d).
- ``quantize_int4``: a float weight, int4 asymmetric in groups along the input (as AutoAWQ's
  zero-point quantizer): d = (max - min) / 15, z = round(-min / d), q = round(w / d) + z,
  clamped to 0-15.
- ``awq_weight`` and ``gptq_weight``: a checkpoint's packed int32 tensors repacked, the same
  integers, zeros and scales: AutoAWQ's GEMM packing (qweight [in, out/8], eight outputs per
  int32 in the order 0 2 4 6 1 3 5 7; qzeros [groups, out/8] alike; scales [groups, out]) and
  GPTQ's (qweight [in/8, out], eight inputs per int32 in order; qzeros [groups, out/8], eight
  outputs in order, each stored as zero - 1 in the "gptq" (v1) format, so 15 reads as 16).

Every weight comes out as rows of blocks, [out, row_bytes] uint8; its dequantized value is
d (q - z) in float32 (d q for int8), one rounding of an exact product.
"""

from __future__ import annotations

import torch

from .quant_blocks import INT4_GROUPS, QuantizedWeight

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # nibble i of an AWQ int32 holds output AWQ_ORDER[i]


def int4_group_size(in_features: int, group: int = 128) -> int:
    """``group`` where it divides the row, else the largest of 64 and 32 that does (a row of
    576, SmolLM2's hidden size, is 9 groups of 64); a ValueError where none does."""
    for size in sorted((g for g in INT4_GROUPS if g <= group), reverse=True):
        if in_features % size == 0:
            return size
    raise ValueError(
        f"int4 groups need rows of a multiple of 32 weights, got a row of {in_features}"
    )


def quantize_int8(weight: torch.Tensor) -> QuantizedWeight:
    """A float [out, in] weight as I8_CH (``in`` a multiple of 32)."""
    w = weight.detach().to("cpu", torch.float32)
    absmax = w.abs().amax(dim=1, keepdim=True)
    scale = torch.where(absmax > 0, absmax / 127, torch.ones_like(absmax))
    q = torch.round(w / scale).clamp(-127, 127).to(torch.int8)
    rows = torch.cat([_f32_bytes(scale), q.view(torch.uint8)], dim=1)
    return QuantizedWeight.of(rows.contiguous(), "I8_CH", w.shape[1])


def quantize_int4(weight: torch.Tensor, group: int = 128) -> QuantizedWeight:
    """A float [out, in] weight as I4_G<group> (``int4_group_size`` chooses a smaller group
    where ``group`` does not divide the row)."""
    w = weight.detach().to("cpu", torch.float32)
    out_features, in_features = w.shape
    group = int4_group_size(in_features, group)
    g = w.reshape(-1, group)
    top, bottom = g.amax(dim=1, keepdim=True), g.amin(dim=1, keepdim=True)
    scale = ((top - bottom).clamp(min=1e-5) / 15).float()
    zero = torch.round(-bottom / scale).clamp(0, 15)
    q = (torch.round(g / scale) + zero).clamp(0, 15).to(torch.uint8)
    return _int4_rows(scale, zero.to(torch.uint8), q, out_features, in_features)


def _int4_rows(scale, zero, q, out_features: int, in_features: int) -> QuantizedWeight:
    """Groups (row-major: a row's groups in order) as I4 blocks: scale f32 [groups, 1], zero
    uint8 [groups, 1] (0-16), q uint8 [groups, group] (0-15)."""
    group = q.shape[1]
    half = group // 2
    nibbles = q[:, :half] | (q[:, half:] << 4)
    blocks = torch.cat([_f32_bytes(scale), zero, nibbles], dim=1)
    return QuantizedWeight.of(blocks.reshape(out_features, -1), INT4_GROUPS[group], in_features)


def _f32_bytes(values: torch.Tensor) -> torch.Tensor:
    """[n, 1] values -> uint8 [n, 4]: each as its float32 bytes."""
    return values.float().reshape(-1).contiguous().view(torch.uint8).view(-1, 4)


def _unpack_int32(packed: torch.Tensor) -> torch.Tensor:
    """int32 [..., c] -> uint8 [..., c, 8]: nibble i of each int32 (bits 4i to 4i + 3)."""
    shifts = torch.arange(0, 32, 4, dtype=torch.int32)
    return ((packed.to(torch.int32)[..., None] >> shifts) & 0xF).to(torch.uint8)


def _check_group(name: str, in_features: int, group: int) -> None:
    if group not in INT4_GROUPS or in_features % group:
        raise ValueError(
            f"{name}: group_size {group} over rows of {in_features} weights is not served "
            f"(served: {', '.join(map(str, INT4_GROUPS))}, dividing the row)"
        )


def awq_weight(
    qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, group: int
) -> QuantizedWeight:
    """AutoAWQ's GEMM tensors of one linear layer as I4_G<group> rows [out, in]."""
    in_features, packed_out = qweight.shape
    out_features = packed_out * 8
    _check_group("AWQ", in_features, group)
    order = torch.tensor(AWQ_ORDER).argsort()  # output j of eight is nibble order[j]
    q = _unpack_int32(qweight)[..., order].reshape(in_features, out_features)
    zeros = _unpack_int32(qzeros)[..., order].reshape(-1, out_features)
    return _from_columns(q, zeros, scales, group)


def gptq_weight(
    qweight: torch.Tensor,
    qzeros: torch.Tensor,
    scales: torch.Tensor,
    group: int,
    zero_offset: int = 1,
    g_idx: torch.Tensor | None = None,
) -> QuantizedWeight:
    """GPTQ's tensors of one linear layer as I4_G<group> rows [out, in]; ``zero_offset`` 1
    for the "gptq" (v1) format, 0 for v2. ``g_idx`` (input k is in group g_idx[k]): with
    act-order (desc_act) the groups are not runs of inputs; the inputs are then held sorted
    by group (each group's ``group`` inputs contiguous) and the weight's input_order says
    which input each column is."""
    packed_in, out_features = qweight.shape
    in_features = packed_in * 8
    _check_group("GPTQ", in_features, group)
    q = _unpack_int32(qweight).permute(0, 2, 1).reshape(in_features, out_features)
    zeros = _unpack_int32(qzeros).reshape(-1, out_features) + zero_offset
    order = _act_order(g_idx, in_features, group)
    if order is None:
        return _from_columns(q, zeros, scales, group)
    held = _from_columns(q[order], zeros, scales, group)
    return QuantizedWeight(held.blocks, held.format, out_features, in_features, order)


def _act_order(g_idx: torch.Tensor | None, in_features: int, group: int):
    """None where ``g_idx`` is the plain grouping (input k in group k // group), else the
    inputs sorted by group; a ValueError unless every group holds ``group`` inputs."""
    if g_idx is None:
        return None
    g_idx = g_idx.to(torch.int64).reshape(-1)
    plain = torch.arange(in_features, dtype=torch.int64) // group
    if g_idx.numel() != in_features:
        raise ValueError(f"GPTQ g_idx has {g_idx.numel()} entries for {in_features} inputs")
    if torch.equal(g_idx, plain):
        return None
    counts = torch.bincount(g_idx, minlength=in_features // group)
    if counts.numel() != in_features // group or not bool((counts == group).all()):
        raise ValueError(f"GPTQ g_idx does not put {group} inputs in each group")
    return torch.argsort(g_idx, stable=True)


def _from_columns(q, zeros, scales, group: int) -> QuantizedWeight:
    """q [in, out] (0-15), zeros and scales [in/group, out]: rows of I4 blocks."""
    in_features, out_features = q.shape
    groups = in_features // group
    if tuple(zeros.shape) != (groups, out_features) or tuple(scales.shape) != (
        groups,
        out_features,
    ):
        raise ValueError(
            f"qzeros/scales of a [{in_features}, {out_features}] weight in groups of {group} "
            f"must unpack to [{groups}, {out_features}], got {list(zeros.shape)} and "
            f"{list(scales.shape)}"
        )
    by_row = q.T.reshape(out_features * groups, group).contiguous()
    scale = scales.T.reshape(-1, 1).float()
    zero = zeros.T.reshape(-1, 1).to(torch.uint8).contiguous()
    return _int4_rows(scale, zero, by_row, out_features, in_features)
