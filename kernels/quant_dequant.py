"""The torch reference dequantizer of the block formats (kernels/quant_blocks.py).

Each weight comes out as the same float32 value the `gguf` package's dequantize gives (the
values HF transformers loads a GGUF file as): scales are float16 read as float32, products
of a scale and an integer are exact in float32, and the one rounding is where a min is
added or subtracted, as there. The native kernels (quant_cpu.c) compute the same values in
registers; this is their tested reference and their fallback.
"""

from __future__ import annotations

import torch

from .quant_blocks import QuantizedWeight, block_format


def dequantize(weight: QuantizedWeight) -> torch.Tensor:
    """The weight as float32 [out_features, in_features], its columns in input order."""
    values = _in_block_order(weight)
    if weight.input_order is None:
        return values
    out = torch.empty_like(values)
    out[:, weight.input_order.to(values.device)] = values
    return out


def _in_block_order(weight: QuantizedWeight) -> torch.Tensor:
    fmt = block_format(weight.format)
    if fmt.row_header:  # I8_CH: a float32 scale per row, then the row's int8s
        rows = weight.blocks.contiguous()
        scale = rows[:, :4].contiguous().view(torch.float32)
        return scale * rows[:, 4:].contiguous().view(torch.int8).float()
    blocks = weight.blocks.contiguous().view(-1, fmt.block_bytes)
    values = _DEQUANTIZE[weight.format](blocks)
    return values.view(weight.out_features, weight.in_features)


def _f16(blocks: torch.Tensor, at: int) -> torch.Tensor:
    """The float16 at byte ``at`` of every block, as float32 [blocks, 1]."""
    return blocks[:, at : at + 2].contiguous().view(torch.float16).float()


def _nibbles(packed: torch.Tensor) -> torch.Tensor:
    """[blocks, 16] bytes -> [blocks, 32]: low nibbles, then high nibbles."""
    return torch.cat([packed & 0x0F, packed >> 4], dim=1)


def _fifth_bits(blocks: torch.Tensor, at: int) -> torch.Tensor:
    """The 32 bits of the 4 bytes at ``at`` (bit j: weight j) as [blocks, 32] values 0/16."""
    bytes_ = blocks[:, at : at + 4].long()
    word = bytes_[:, 0] | bytes_[:, 1] << 8 | bytes_[:, 2] << 16 | bytes_[:, 3] << 24
    bits = (word[:, None] >> torch.arange(32, device=blocks.device)) & 1
    return (bits << 4).to(torch.uint8)


def _q4_0(b: torch.Tensor) -> torch.Tensor:
    return _f16(b, 0) * (_nibbles(b[:, 2:18]).float() - 8)


def _q4_1(b: torch.Tensor) -> torch.Tensor:
    return _f16(b, 0) * _nibbles(b[:, 4:20]).float() + _f16(b, 2)


def _q5_0(b: torch.Tensor) -> torch.Tensor:
    q = _nibbles(b[:, 6:22]) | _fifth_bits(b, 2)
    return _f16(b, 0) * (q.float() - 16)


def _q5_1(b: torch.Tensor) -> torch.Tensor:
    q = _nibbles(b[:, 8:24]) | _fifth_bits(b, 4)
    return _f16(b, 0) * q.float() + _f16(b, 2)


def _q8_0(b: torch.Tensor) -> torch.Tensor:
    return _f16(b, 0) * b[:, 2:34].contiguous().view(torch.int8).float()


def _k_scales(packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K/Q5_K's 12 bytes -> eight 6-bit scales and eight 6-bit mins, [blocks, 8] each.
    Bytes 0-3: scales 0-3 (low 6 bits), 4-7: mins 0-3; bytes 8-11 hold the low 4 bits of
    scales 4-7 (low nibble) and mins 4-7 (high nibble), whose top 2 bits are the top bits of
    bytes 0-3 (scales) and 4-7 (mins)."""
    low, high, mixed = packed[:, 0:4], packed[:, 4:8], packed[:, 8:12]
    scales = torch.cat([low & 0x3F, (mixed & 0x0F) | ((low >> 6) << 4)], dim=1)
    mins = torch.cat([high & 0x3F, (mixed >> 4) | ((high >> 6) << 4)], dim=1)
    return scales.float(), mins.float()


def _k_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """128 bytes -> 256 values: each 32 bytes give 64 weights, low nibbles first."""
    chunks = packed.reshape(-1, 4, 1, 32)
    return torch.cat([chunks & 0x0F, chunks >> 4], dim=2).reshape(-1, 8, 32)


def _q4_k(b: torch.Tensor) -> torch.Tensor:
    scales, mins = _k_scales(b[:, 4:16])
    d = (_f16(b, 0) * scales)[:, :, None]
    dm = (_f16(b, 2) * mins)[:, :, None]
    return (d * _k_nibbles(b[:, 16:144]).float() - dm).reshape(-1, 256)


def _q5_k(b: torch.Tensor) -> torch.Tensor:
    scales, mins = _k_scales(b[:, 4:16])
    d = (_f16(b, 0) * scales)[:, :, None]
    dm = (_f16(b, 2) * mins)[:, :, None]
    high = b[:, 16:48]  # bit j of byte l: the fifth bit of weight 32 j + l
    bits = (high[:, None, :] >> torch.arange(8, device=b.device, dtype=torch.uint8)[:, None]) & 1
    q = _k_nibbles(b[:, 48:176]) | (bits << 4)
    return (d * q.float() - dm).reshape(-1, 256)


def _q6_k(b: torch.Tensor) -> torch.Tensor:
    """Two halves of 128 weights; in each, 64 bytes of nibbles (low nibbles: weights 0-63,
    high: 64-127) and 32 bytes of two-bit highs (bits 2s..2s+1 of byte l: weight 32 s + l)."""
    low = b[:, 0:128].reshape(-1, 2, 1, 64)
    low = torch.cat([low & 0x0F, low >> 4], dim=2).reshape(-1, 2, 4, 32)
    shifts = torch.tensor([0, 2, 4, 6], device=b.device, dtype=torch.uint8)[:, None]
    high = (b[:, 128:192].reshape(-1, 2, 1, 32) >> shifts) & 0x03
    q = (low | (high << 4)).float() - 32
    scales = b[:, 192:208].contiguous().view(torch.int8).float()
    d = (_f16(b, 208) * scales)[:, :, None]
    return (d * q.reshape(-1, 16, 16)).reshape(-1, 256)


def _int4_group(b: torch.Tensor) -> torch.Tensor:
    """I4_G*: d f32, z u8, nibbles; (q - z) is exact, so one rounding: its product by d."""
    d = b[:, 0:4].contiguous().view(torch.float32)
    q = _nibbles(b[:, 5:]).float()
    return (q - b[:, 4:5].float()) * d


_DEQUANTIZE = {
    "Q4_0": _q4_0,
    "Q4_1": _q4_1,
    "Q5_0": _q5_0,
    "Q5_1": _q5_1,
    "Q8_0": _q8_0,
    "Q4_K": _q4_k,
    "Q5_K": _q5_k,
    "Q6_K": _q6_k,
    "I4_G32": _int4_group,
    "I4_G64": _int4_group,
    "I4_G128": _int4_group,
}
