"""An adapter file's tensors as views of the bytes that were read and hashed, made in small steps.

safetensors' loader from bytes copies every tensor while it holds the GIL (10-50 ms for a
78 MB rank-64 adapter, measured on 2 cores), and each of the hundreds of torch ops in the
engine's running step waits for the GIL at its end: a load on a loader thread then stalled a
decode step several times over. The format is small (a little-endian u64 header length, a
JSON header, the tensors' bytes), so each tensor here is a `torch.frombuffer` view of the
caller's buffer, checked as safetensors checks it: known dtype, a shape of non-negative
integers, offsets inside the data and matching the shape, no two tensors overlapping.
"""

from __future__ import annotations

import json
import math

import torch

from loragate.adapters.pacing import UNPACED, LoadPacing

DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
MAX_HEADER_BYTES = 100_000_000  # safetensors' own limit


class SafetensorsError(ValueError):
    pass


def tensor_views(buffer: memoryview, pacing: LoadPacing = UNPACED) -> dict[str, torch.Tensor]:
    """Name -> tensor for every tensor of a safetensors file held in `buffer` (kept alive by
    the views); SafetensorsError naming what is wrong with anything else. ``pacing`` pauses
    the loop over the tensors beside running steps (adapters/pacing.py)."""
    if len(buffer) < 8:
        raise SafetensorsError(f"file of {len(buffer)} bytes has no header")
    header_len = int.from_bytes(buffer[:8], "little")
    if header_len > min(MAX_HEADER_BYTES, len(buffer) - 8):
        raise SafetensorsError(f"header length {header_len} exceeds the file")
    try:
        header = json.loads(bytes(buffer[8 : 8 + header_len]))
    except (ValueError, RecursionError) as exc:
        raise SafetensorsError(f"header is not JSON: {exc}") from None
    if not isinstance(header, dict):
        raise SafetensorsError("header is not a JSON object")
    start, size = 8 + header_len, len(buffer) - 8 - header_len
    views, spans = {}, []
    for name, info in pacing.paced(header.items()):
        if name == "__metadata__":
            continue
        dtype, shape, (begin, end) = _entry(name, info, size)
        spans.append((begin, end, name))
        views[name] = _view(buffer, dtype, shape, start + begin)
    spans.sort()
    for (_, end, name), (begin, _, other) in zip(spans, spans[1:], strict=False):
        if begin < end:
            raise SafetensorsError(f"tensors {name!r} and {other!r} overlap")
    return views


def _entry(name: str, info, size: int) -> tuple[torch.dtype, list[int], tuple[int, int]]:
    if not isinstance(info, dict):
        raise SafetensorsError(f"tensor {name!r}: entry is not an object")
    dtype = DTYPES.get(info.get("dtype"))
    if dtype is None:
        raise SafetensorsError(f"tensor {name!r}: unknown dtype {info.get('dtype')!r}")
    shape, offsets = info.get("shape"), info.get("data_offsets")
    if not isinstance(shape, list) or not all(_count(d) for d in shape):
        raise SafetensorsError(f"tensor {name!r}: bad shape {shape!r}")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(map(_count, offsets))):
        raise SafetensorsError(f"tensor {name!r}: bad data_offsets {offsets!r}")
    begin, end = offsets
    if not begin <= end <= size:
        raise SafetensorsError(f"tensor {name!r}: data_offsets {offsets} outside {size} bytes")
    itemsize = torch.empty((), dtype=dtype).element_size()
    if end - begin != math.prod(shape) * itemsize:
        raise SafetensorsError(f"tensor {name!r}: {end - begin} bytes for shape {shape}")
    return dtype, shape, (begin, end)


def _count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _view(buffer: memoryview, dtype: torch.dtype, shape: list[int], offset: int) -> torch.Tensor:
    numel = math.prod(shape)
    if numel == 0:
        return torch.empty(shape, dtype=dtype)
    itemsize = torch.empty((), dtype=dtype).element_size()
    if offset % itemsize:  # unaligned: the only case that copies
        raw = bytearray(buffer[offset : offset + numel * itemsize])
        return torch.frombuffer(raw, dtype=dtype).view(shape)
    return torch.frombuffer(buffer, dtype=dtype, count=numel, offset=offset).view(shape)
