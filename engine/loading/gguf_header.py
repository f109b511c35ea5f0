"""A GGUF file's header read quickly: its architecture and its table of tensors, each tensor's
bytes a memory-mapped view of the file (checked to lie within it).

The `gguf` package's reader builds a numpy view per element of every metadata array, which
over a 49k-token vocabulary takes about 5 s (AMD EPYC, 2026-11-29); this walks the same
layout with `struct` and skips what the weights do not need, in tens of milliseconds. The
layout (GGUF v2 and v3, little-endian): magic ``GGUF``, version u32, tensor count u64,
metadata count u64; each metadata entry a string key, a u32 value type and the value
(strings: u64 length + bytes; arrays: u32 item type, u64 count, items); each tensor a string
name, u32 dimension count, u64 dimensions (innermost first), u32 type, u64 offset; the data
starts at the next multiple of ``general.alignment`` (32 by default).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

# Sizes of the fixed-size metadata value types, by type id; 8 is a string, 9 an array.
_SCALAR_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True)
class HeaderTensor:
    """One tensor of the table: ``shape`` innermost dimension first, as GGUF stores it;
    ``data`` its bytes (uint8, a view of the mapped file)."""

    name: str
    tensor_type: object  # gguf.GGMLQuantizationType
    shape: np.ndarray
    n_bytes: int
    data: np.ndarray


class GGUFHeader:
    """``architecture`` and ``tensors`` of the file at ``path``; a ValueError naming what is
    wrong for a file that is not GGUF, of a version not read here, or truncated."""

    def __init__(self, path: Path):
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

        self.path = Path(path)
        self._data = np.memmap(self.path, dtype=np.uint8, mode="r")
        self._buffer = memoryview(self._data)
        self._at = 0
        if bytes(self._take(4)) != b"GGUF":
            raise ValueError(f"{self.path} is not a GGUF file (no GGUF magic)")
        (version,) = self._unpack("<I")
        if version not in (2, 3):
            raise ValueError(f"{self.path} is GGUF version {version}; versions 2 and 3 are read")
        tensor_count, kv_count = self._unpack("<QQ")
        self.architecture: str | None = None
        alignment = 32
        for _ in range(kv_count):
            key = self._string()
            (kind,) = self._unpack("<I")
            if key == "general.architecture" and kind == _STRING:
                self.architecture = self._string()
            elif key == "general.alignment" and kind == 4:
                (alignment,) = self._unpack("<I")
            else:
                self._skip_value(kind)
        entries = []
        for _ in range(tensor_count):
            name = self._string()
            (dims,) = self._unpack("<I")
            shape = np.array(self._unpack(f"<{dims}Q"), dtype=np.uint64)
            type_id, offset = self._unpack("<IQ")
            entries.append((name, shape, type_id, offset))
        start = -(-self._at // alignment) * alignment
        self.tensors: list[HeaderTensor] = []
        for name, shape, type_id, offset in entries:
            try:
                qtype = GGMLQuantizationType(type_id)
            except ValueError:
                raise ValueError(
                    f"GGUF file {self.path}: tensor {name} has unknown type id {type_id}"
                ) from None
            block, type_size = GGML_QUANT_SIZES[qtype]
            count = int(np.prod(shape))
            if count % block:
                raise ValueError(
                    f"GGUF file {self.path}: tensor {name} of type {qtype.name} has {count} "
                    f"values, not whole blocks of {block}"
                )
            begin = start + offset
            end = begin + count // block * type_size
            if end > len(self._data):
                raise ValueError(
                    f"GGUF file {self.path} is truncated: tensor {name} ({qtype.name}, "
                    f"{list(reversed(shape.tolist()))}) needs bytes {begin} to {end}, "
                    f"the file has {len(self._data)}"
                )
            data = self._data[begin:end]
            self.tensors.append(HeaderTensor(name, qtype, shape, end - begin, data))

    def _take(self, size: int) -> memoryview:
        if self._at + size > len(self._buffer):
            raise ValueError(
                f"GGUF file {self.path} is truncated: its header runs past the file's "
                f"{len(self._buffer)} bytes"
            )
        part = self._buffer[self._at : self._at + size]
        self._at += size
        return part

    def _unpack(self, fmt: str) -> tuple:
        return struct.unpack(fmt, self._take(struct.calcsize(fmt)))

    def _string(self) -> str:
        (size,) = self._unpack("<Q")
        return bytes(self._take(size)).decode("utf-8", errors="replace")

    def _skip_value(self, kind: int) -> None:
        if kind in _SCALAR_SIZES:
            self._take(_SCALAR_SIZES[kind])
        elif kind == _STRING:
            (size,) = self._unpack("<Q")
            self._take(size)
        elif kind == _ARRAY:
            item, count = self._unpack("<IQ")
            if item in _SCALAR_SIZES:
                self._take(_SCALAR_SIZES[item] * count)
            else:
                for _ in range(count):
                    self._skip_value(item)
        else:
            raise ValueError(f"GGUF file {self.path}: unknown metadata value type {kind}")
