"""Adapter files parsed as views of the bytes read: the same tensors safetensors gives, and
the same refusals. (That loads no longer stall running steps is tests/engine/
test_adapter_cold_start.py's to show.)"""

from __future__ import annotations

import hashlib
import json
import struct

import pytest
import torch
from safetensors.torch import load as safetensors_load
from safetensors.torch import save as safetensors_save

from loragate.adapters.loader import hashed_read
from loragate.adapters.pacing import UNPACED
from loragate.adapters.safetensors_views import SafetensorsError, tensor_views


def _tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "a.lora_A.weight": torch.randn(8, 33, generator=g),
        "a.lora_B.weight": torch.randn(17, 8, generator=g).to(torch.bfloat16),
        "b.half": torch.randn(3, 5, generator=g).to(torch.float16),
        "c.double": torch.randn(2, 3, 4, generator=g).to(torch.float64),
        "d.ints": torch.arange(7, dtype=torch.int64),
        "e.empty": torch.zeros(0, 4),
        "f.scalar": torch.tensor(2.5),
    }


def test_views_equal_what_safetensors_loads():
    data = safetensors_save(_tensors(), metadata={"format": "pt"})
    expected = safetensors_load(data)
    got = tensor_views(memoryview(bytearray(data)))
    assert set(got) == set(expected)
    for name, tensor in expected.items():
        assert got[name].dtype == tensor.dtype and got[name].shape == tensor.shape, name
        assert torch.equal(got[name], tensor), name


def test_views_share_the_buffer_rather_than_copy():
    buffer = bytearray(safetensors_save({"w": torch.ones(4, 4)}))
    view = tensor_views(memoryview(buffer))["w"]
    buffer[-4:] = struct.pack("<f", 7.0)
    assert view[3, 3].item() == 7.0


def _file(header: dict, body: bytes) -> memoryview:
    text = json.dumps(header).encode()
    return memoryview(bytearray(struct.pack("<Q", len(text)) + text + body))


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (memoryview(b"\x01\x02"), "no header"),
        (memoryview(struct.pack("<Q", 10**9) + b"{}"), "header length"),
        (memoryview(struct.pack("<Q", 3) + b"{x}"), "not JSON"),
        (_file([1], b""), "not a JSON object"),  # type: ignore[arg-type]
        (_file({"w": {"dtype": "Q9", "shape": [1], "data_offsets": [0, 4]}}, b"0000"), "dtype"),
        (_file({"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}, b"0000"), "shape"),
        (_file({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0]}}, b"0000"), "offsets"),
        (_file({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, b"0000"), "outside"),
        (
            _file({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, b"0000"),
            "bytes for",
        ),
        (
            _file(
                {
                    "w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                    "v": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]},
                },
                bytes(8),
            ),
            "overlap",
        ),
    ],
)
def test_malformed_files_are_refused_with_the_reason(data, message):
    with pytest.raises(SafetensorsError, match=message):
        tensor_views(data)


def test_an_unaligned_tensor_is_copied_not_misread():
    # A 3-byte tensor first puts the float32 one at an odd offset.
    body = b"abc" + struct.pack("<2f", 1.5, -2.0)
    data = _file(
        {
            "u": {"dtype": "U8", "shape": [3], "data_offsets": [0, 3]},
            "w": {"dtype": "F32", "shape": [2], "data_offsets": [3, 11]},
        },
        body,
    )
    got = tensor_views(data)
    assert got["w"].tolist() == [1.5, -2.0] and bytes(got["u"].tolist()) == b"abc"


def test_hashed_read_returns_the_file_exactly_and_its_hash(tmp_path):
    for size in (0, 1, 4 * 2**20, 4 * 2**20 + 5, 8 * 2**20 + 3):
        path = tmp_path / f"f{size}"
        content = bytes((i * 7) % 251 for i in range(size))
        path.write_bytes(content)
        data, digest = hashed_read(path, UNPACED)
        assert bytes(data) == content, size
        assert digest == hashlib.sha256(content).hexdigest(), size
        data, digest = hashed_read(path, UNPACED, hash_it=False)
        assert bytes(data) == content and digest is None, size
