"""engine/loading/gguf_header.py reads the same tensor table as the `gguf` package's reader, and
names what is wrong with a file that is not GGUF or is cut short."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGUFReader
from gguf_testlib import write_quantized_gguf

from loragate.engine.loading.default_model import default_model_path
from loragate.engine.loading.gguf_header import GGUFHeader


@pytest.mark.parametrize("source", ["default", "tiny"])
def test_the_tensor_table_matches_gguf_s_reader(tmp_path, source):
    path = (
        default_model_path()
        if source == "default"
        else write_quantized_gguf(tmp_path / "tiny.gguf", "Q4_K", types={"attn_v": "Q6_K"})
    )
    ours, theirs = GGUFHeader(path), GGUFReader(path)
    assert ours.architecture == "llama"
    assert len(ours.tensors) == len(theirs.tensors)
    for mine, reference in zip(ours.tensors, theirs.tensors, strict=True):
        assert mine.name == reference.name and mine.tensor_type == reference.tensor_type
        assert mine.shape.tolist() == reference.shape.tolist()
        assert mine.n_bytes == int(reference.n_bytes)
        assert np.array_equal(
            np.asarray(mine.data), np.asarray(reference.data).view(np.uint8).ravel()
        )


def test_not_gguf_and_cut_headers_are_refused_naming_it(tmp_path):
    other = tmp_path / "other.gguf"
    other.write_bytes(b"NOPE" + bytes(64))
    with pytest.raises(ValueError, match="not a GGUF file"):
        GGUFHeader(other)
    data = write_quantized_gguf(tmp_path / "tiny.gguf", "Q8_0").read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[:200])
    with pytest.raises(ValueError, match="cut.gguf is truncated: its header runs past"):
        GGUFHeader(cut)
