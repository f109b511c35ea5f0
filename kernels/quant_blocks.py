"""Weights held in llama.cpp's block formats (GGUF tensor types), as raw bytes: no float copy.

A row of ``in_features`` weights is ``in_features / block_size`` blocks of ``block_bytes``
bytes each, every block self-contained (its float16 scales beside its packed integers), so
a [out, in] tensor is a [out, row_bytes] uint8 tensor whose rows can be sliced, gathered
(embedding lookups) and stacked (fused projections) as bytes. The layouts, as ggml writes
them (little-endian; "f16" a float16 scale):

- Q8_0 (32 weights): d f16, 32 x int8.                          w = d q
- Q4_0 (32): d, 16 bytes of nibbles (low: weights 0-15, high: 16-31). w = d (q - 8)
- Q4_1 (32): d, m f16, 16 bytes of nibbles.                      w = d q + m
- Q5_0 (32): d, 4 bytes of fifth bits (bit j: weight j), 16 bytes of nibbles. w = d (q - 16)
- Q5_1 (32): d, m, 4 bytes of fifth bits, 16 bytes of nibbles.   w = d q + m
- Q4_K (256): d, dmin f16, 12 bytes of eight 6-bit scales and mins, 128 bytes of nibbles
  (64 weights per 32 bytes: low nibbles the first 32, high the next). w = d sc q - dmin m
- Q5_K (256): as Q4_K plus 32 bytes of fifth bits (bit j of byte l: weight 32 j + l).
- Q6_K (256): 128 bytes of low nibbles, 64 of two-bit highs, sixteen int8 scales (one per
  16 weights), d f16 last.                                          w = d sc (q - 32)

and loragate's own integer formats, which float bases quantized at load (``--quantization``)
and AWQ/GPTQ checkpoints (repacked: the same integers, zeros and scales) are held in ("f32"
a float32 scale, so any checkpoint's scales are kept exactly):

- I8_CH (int8 symmetric per output channel): a row header of d f32, then the row's int8s
  (blocks of 32 with no header of their own).                     w = d q
- I4_G32, I4_G64, I4_G128 (int4 asymmetric in groups of 32, 64, 128): d f32, z u8 (0-16;
  16 is GPTQ's stored zero 15 plus its offset of 1), then the nibbles as Q4_0's (byte i:
  weight i low, weight i + group/2 high).                          w = d (q - z)

kernels/quant_dequant.py turns blocks into floats (the torch reference), and
kernels/quant_linear.py multiplies by them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch


@dataclass(frozen=True)
class BlockFormat:
    """One block type: ``code`` is the native kernels' id for it (kernels/quant_cpu.c)."""

    name: str
    block_size: int  # weights per block
    block_bytes: int
    code: int
    row_header: int = 0  # bytes before a row's first block (I8_CH's scale)


FORMATS = {
    f.name: f
    for f in (
        BlockFormat("Q4_0", 32, 18, 0),
        BlockFormat("Q4_1", 32, 20, 1),
        BlockFormat("Q5_0", 32, 22, 2),
        BlockFormat("Q5_1", 32, 24, 3),
        BlockFormat("Q8_0", 32, 34, 4),
        BlockFormat("Q4_K", 256, 144, 5),
        BlockFormat("Q5_K", 256, 176, 6),
        BlockFormat("Q6_K", 256, 210, 7),
        BlockFormat("I8_CH", 32, 32, 8, row_header=4),
        BlockFormat("I4_G32", 32, 21, 9),
        BlockFormat("I4_G64", 64, 37, 10),
        BlockFormat("I4_G128", 128, 69, 11),
    )
}
# The GGUF (llama.cpp) types among them; the rest are loragate's own integer formats.
GGUF_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K")
INT4_GROUPS = {32: "I4_G32", 64: "I4_G64", 128: "I4_G128"}


def block_format(name: str) -> BlockFormat:
    """The format named ``name``; a clear error naming the ones supported otherwise."""
    found = FORMATS.get(name)
    if found is None:
        raise ValueError(f"block type {name!r} is not supported; supported: {', '.join(FORMATS)}")
    return found


def row_bytes(name: str, in_features: int) -> int:
    """Bytes of one row of ``in_features`` weights in format ``name``."""
    fmt = block_format(name)
    if in_features % fmt.block_size:
        raise ValueError(
            f"a {name} row holds a multiple of {fmt.block_size} weights, not {in_features}"
        )
    return fmt.row_header + in_features // fmt.block_size * fmt.block_bytes


@dataclass(frozen=True)
class QuantizedWeight:
    """A [out_features, in_features] weight as its blocks: ``blocks`` is uint8
    [out_features, row_bytes] with a contiguous last dimension (rows may be strided).

    ``input_order``: where the blocks hold the input columns in another order (a GPTQ
    checkpoint quantized with act-order, its groups made contiguous), column i of the blocks
    is input ``input_order[i]``: products take x's columns in that order, and
    ``dequantize`` puts them back (kernels/quant_dequant.py)."""

    blocks: torch.Tensor
    format: str
    out_features: int
    in_features: int
    input_order: torch.Tensor | None = None
    # "int8": decode-sized products (and, where AMX-INT8 tiles run, prefill-sized ones too)
    # quantize the activations to int8 where the format allows (kernels/quant_int8.py, the
    # optional fast mode); None: float32 activations.
    activations: str | None = None

    def __post_init__(self):
        want = (self.out_features, row_bytes(self.format, self.in_features))
        if self.blocks.dtype != torch.uint8 or tuple(self.blocks.shape) != want:
            raise ValueError(
                f"{self.format} blocks of a [{self.out_features}, {self.in_features}] weight are "
                f"uint8 {list(want)}, got {self.blocks.dtype} {list(self.blocks.shape)}"
            )
        if self.blocks.stride(-1) != 1:
            raise ValueError("a quantized weight's rows must be contiguous bytes")

    @classmethod
    def of(cls, blocks: torch.Tensor, format: str, in_features: int) -> QuantizedWeight:
        """``blocks`` [out, row_bytes] (or flat) holding rows of ``in_features`` weights."""
        width = row_bytes(format, in_features)
        if blocks.dim() == 1:
            if blocks.numel() % width:
                raise ValueError(
                    f"{blocks.numel()} bytes are not whole {format} rows of {in_features}"
                )
            blocks = blocks.view(-1, width)
        return cls(blocks, format, blocks.shape[0], in_features)

    @property
    def nbytes(self) -> int:
        """The bytes this weight holds (its blocks; a view of a file counts its rows)."""
        return self.blocks.shape[0] * self.blocks.shape[1]

    @property
    def shape(self) -> tuple[int, int]:
        return (self.out_features, self.in_features)

    def rows(self, index: torch.Tensor) -> QuantizedWeight:
        """The weight's rows ``index`` (an embedding lookup: bytes gathered, not floats)."""
        return QuantizedWeight(
            self.blocks[index], self.format, index.numel(), self.in_features, self.input_order
        )


@dataclass(frozen=True)
class StackedWeights:
    """Weights of different formats stacked by rows (a fused projection whose parts a file
    stores in different types, as Q4_K_M files do): each part fills its own output columns."""

    parts: tuple[QuantizedWeight | torch.Tensor, ...]

    @property
    def out_features(self) -> int:
        return sum(p.shape[0] for p in self.parts)

    @property
    def in_features(self) -> int:
        return self.parts[0].shape[1]

    @property
    def shape(self) -> tuple[int, int]:
        return (self.out_features, self.in_features)

    @property
    def nbytes(self) -> int:
        return sum(
            p.nbytes if isinstance(p, QuantizedWeight) else p.numel() * p.element_size()
            for p in self.parts
        )


def _same_order(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return torch.equal(a, b)


def stack_rows(parts: list) -> QuantizedWeight | StackedWeights | torch.Tensor:
    """The parts stacked by rows: one weight where they share a format (bytes concatenated),
    float tensors concatenated, and a StackedWeights where formats differ."""
    if all(isinstance(p, torch.Tensor) for p in parts):
        return torch.cat(parts)
    first = parts[0]
    same = all(
        isinstance(p, QuantizedWeight)
        and p.format == first.format
        and p.in_features == first.in_features
        and _same_order(p.input_order, first.input_order)
        for p in parts
    )
    if same:
        blocks = torch.cat([p.blocks for p in parts])
        stacked = QuantizedWeight.of(blocks, first.format, first.in_features)
        return replace(stacked, input_order=first.input_order)
    widths = {p.shape[1] for p in parts}
    if len(widths) != 1:
        raise ValueError(f"stacked weights need one input width, got {sorted(widths)}")
    return StackedWeights(tuple(parts))
