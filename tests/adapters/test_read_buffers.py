"""Adapter reads reuse the memory of earlier reads (adapters/read_buffers.py), and never
read into memory an adapter's weights still view."""

from __future__ import annotations

import gc
import mmap
import re

import pytest
import torch
from safetensors.torch import load_file
from tiny_llama import ALL_MODULES

from loragate.adapters import load_adapter
from loragate.adapters.read_buffers import ReadBuffers, unviewed

KEY = re.compile(r"layers\.(\d+)\.\w+\.(\w+)\.lora_([AB])\.weight$")


def assert_holds_its_file(adapter, path):
    """Every (layer, module) of ``adapter`` is exactly what its safetensors file holds."""
    found = {}
    for key, tensor in load_file(str(path / "adapter_model.safetensors")).items():
        layer, module, half = KEY.search(key).groups()
        found.setdefault((int(layer), module), {})[half] = tensor
    assert set(adapter.weights) == set(found)
    for key, (a, b) in adapter.weights.items():
        assert torch.equal(a, found[key]["A"]) and torch.equal(b, found[key]["B"]), key


def test_a_second_read_reuses_the_first_ones_memory_and_both_hold_their_files(spec, make_adapter):
    buffers = ReadBuffers()
    paths = [make_adapter(f"a{i}", rank=8, targets=list(ALL_MODULES), seed=i) for i in range(3)]
    first = load_adapter(paths[0], spec, 16, buffers=buffers)
    assert buffers.reused == 0
    second = load_adapter(paths[1], spec, 16, buffers=buffers)
    assert buffers.reused == 1, "the second read took the mapping the first one gave back"
    third = load_adapter(paths[2], spec, 16, buffers=buffers)
    assert buffers.reused == 2
    for adapter, path in zip((first, second, third), paths, strict=True):
        assert set(adapter.stacked) == set(ALL_MODULES), "every module copied out of the read"
        assert_holds_its_file(adapter, path)


def test_memory_an_adapter_still_views_is_never_read_into_again(spec, make_adapter):
    """down_proj's layers have two ranks, so they are not stacked: its rows stay views of
    the read's mapping (its alpha keeps its scale the adapter's, so B is not rescaled into a
    copy), which must then stay theirs. Two adapters of the same shapes: were the first's
    mapping offered again, the second read would fit in it and overwrite it."""
    buffers = ReadBuffers()
    shapes = {"rank": 4, "alpha": 8, "targets": ["q_proj", "down_proj"]}
    layer = "model.layers.1.mlp.down_proj"
    pattern = {"rank_pattern": {layer: 8}, "alpha_pattern": {layer: 16}}
    viewed_path = make_adapter("viewed", seed=5, **shapes, **pattern)
    viewed = load_adapter(viewed_path, spec, 8, buffers=buffers)
    assert "down_proj" not in viewed.stacked and "q_proj" in viewed.stacked
    twin_path = make_adapter("twin", seed=6, **shapes, **pattern)
    twin = load_adapter(twin_path, spec, 8, buffers=buffers)
    assert buffers.reused == 0, "the first read's mapping is still viewed: a fresh one"
    assert_holds_its_file(viewed, viewed_path)
    assert_holds_its_file(twin, twin_path)
    plain_path = make_adapter("plain", seed=7, rank=4, targets=["q_proj"])
    assert_holds_its_file(load_adapter(plain_path, spec, 8, buffers=buffers), plain_path)
    assert buffers.reused == 0, "neither viewed mapping was kept"
    assert_holds_its_file(viewed, viewed_path)


def test_a_failed_read_gives_back_nothing_it_still_views(spec, make_adapter):
    """A refused adapter's error may keep its tensors (the traceback's frames): the lease
    offers its mapping back, kept only if unviewed; the next read is exact either way."""
    buffers = ReadBuffers()
    bad = make_adapter("bad", rank=16, targets=["q_proj"], seed=8)
    with pytest.raises(ValueError, match="max_lora_rank"):
        load_adapter(bad, spec, 8, buffers=buffers)
    good = make_adapter("good", rank=4, targets=["q_proj"], seed=9)
    assert_holds_its_file(load_adapter(good, spec, 8, buffers=buffers), good)


def test_a_mapping_is_unviewed_only_once_every_view_is_gone():
    buffer = mmap.mmap(-1, 4096)
    assert unviewed(buffer)
    view = memoryview(buffer)[:64]
    tensor = torch.frombuffer(view, dtype=torch.float32)
    del view
    assert not unviewed(buffer), "a tensor made from it still reads it"
    del tensor
    gc.collect()
    assert unviewed(buffer)


def test_only_a_few_mappings_of_bounded_size_are_kept():
    buffers = ReadBuffers(kept=2, max_bytes=1 << 20)
    with buffers.lend() as lease:
        sizes = [lease.take(n) for n in (4096, 8192, 16384, 2 << 20)]
    assert buffers.reused == 0
    with buffers.lend() as lease:
        taken = lease.take(10_000)
    assert taken is sizes[2], "the smallest kept mapping that fits"
    assert sizes[0].closed, "only the two largest under the bound are kept"
    assert not sizes[3].closed, "one over the bound is let go, not closed under its views"
