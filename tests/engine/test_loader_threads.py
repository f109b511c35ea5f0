"""How many adapter loads run at once beside the steps: one on a small machine, where a
second loader slowed the steps by a third (engine/lora/adapter_residency.py), two where cores
are to spare."""

from __future__ import annotations

import pytest

from loragate.engine.lora.adapter_residency import MAX_LOADER_THREADS, loader_threads, usable_cores


@pytest.mark.parametrize(
    ("cores", "threads"), [(1, 1), (2, 1), (3, 1), (4, 1), (8, 2), (16, 2), (128, 2)]
)
def test_loads_at_once_follow_the_cores(cores, threads):
    assert loader_threads(cores) == threads


def test_this_machine_gets_at_least_one_loader_and_at_most_the_cap():
    assert usable_cores() >= 1
    assert 1 <= loader_threads(usable_cores()) <= MAX_LOADER_THREADS
