"""Random weights in the block formats, for the tests of kernels/quant_*.py.

Blocks are random bytes (every bit pattern of the packed integers and 6-bit scales is a
valid block) with their float16 scales and mins set to finite values of a chosen size, so
the weights are random in every format, including those the `gguf` package cannot quantize;
loragate's integer formats (I8_CH, I4_G*) get float32 scales and zeros 0-16 likewise, and
``int_reference`` decodes them in float64 from the layout quant_blocks.py documents.

Imported by bare name: pytest puts tests/kernels on sys.path.
"""

from __future__ import annotations

import numpy as np
import torch
from quant_checkpoint_testlib import int_reference  # noqa: F401 (the tests import it here)

from loragate.kernels.quant_blocks import FORMATS, QuantizedWeight

# Byte offsets of each format's float16 fields: (scales, mins).
HALVES = {
    "Q4_0": ((0,), ()),
    "Q4_1": ((0,), (2,)),
    "Q5_0": ((0,), ()),
    "Q5_1": ((0,), (2,)),
    "Q8_0": ((0,), ()),
    "Q4_K": ((0,), (2,)),
    "Q5_K": ((0,), (2,)),
    "Q6_K": ((208,), ()),
}
# The typical integer a scale multiplies (so weights come out near unit size / sqrt(in)).
QUANT_RANGE = {"Q4_0": 8, "Q4_1": 8, "Q5_0": 16, "Q5_1": 16, "Q8_0": 128}
QUANT_RANGE.update({"Q4_K": 8 * 32, "Q5_K": 16 * 32, "Q6_K": 32 * 64})


def random_blocks(name: str, out_features: int, in_features: int, seed: int) -> np.ndarray:
    """uint8 [out_features, row_bytes] of random blocks."""
    fmt = FORMATS[name]
    rng = np.random.default_rng(seed)
    if name in INT_RANGE:
        return _random_int_rows(name, out_features, in_features, rng)
    count = out_features * in_features // fmt.block_size
    blocks = rng.integers(0, 256, (count, fmt.block_bytes), dtype=np.uint8)
    size = in_features**-0.5 / QUANT_RANGE[name]
    scales, mins = HALVES[name]
    for at in scales:
        d = rng.uniform(0.5, 1.5, (count, 1)) * size * rng.choice([-1, 1], (count, 1))
        blocks[:, at : at + 2] = d.astype(np.float16).view(np.uint8)
    for at in mins:
        m = rng.standard_normal((count, 1)) * in_features**-0.5 * QUANT_RANGE[name] * size
        blocks[:, at : at + 2] = m.astype(np.float16).view(np.uint8)
    return blocks.reshape(out_features, -1)


INT_RANGE = {"I8_CH": 64, "I4_G32": 8, "I4_G64": 8, "I4_G128": 8}


def _random_int_rows(name: str, rows: int, cols: int, rng) -> np.ndarray:
    fmt = FORMATS[name]
    size = cols**-0.5 / INT_RANGE[name]
    if name == "I8_CH":
        scales = (rng.uniform(0.5, 1.5, (rows, 1)) * size).astype(np.float32)
        q = rng.integers(-128, 128, (rows, cols), dtype=np.int8)
        return np.concatenate([scales.view(np.uint8), q.view(np.uint8)], axis=1)
    count = rows * cols // fmt.block_size
    blocks = rng.integers(0, 256, (count, fmt.block_bytes), dtype=np.uint8)
    scales = rng.uniform(0.5, 1.5, (count, 1)) * size * rng.choice([-1, 1], (count, 1))
    blocks[:, 0:4] = scales.astype(np.float32).view(np.uint8)
    blocks[:, 4] = rng.integers(0, 17, count)  # 16: GPTQ's stored 15 plus its offset
    return blocks.reshape(rows, -1)


def random_weight(name: str, out_features: int, in_features: int, seed: int = 0):
    blocks = torch.from_numpy(random_blocks(name, out_features, in_features, seed))
    return QuantizedWeight.of(blocks, name, in_features)
