"""A replica's engine runs as many torch threads as its CPUs (whole ones, at least one),
even in a worker that loaded torch before Ray set OMP_NUM_THREADS: there OpenMP keeps one
thread per core, and two replicas of half a CPU on 2 cores ran two threads each, their
steps 10x as long (the fleet check run, 2026-11-27). The Ray test of the same is
test_ray_replicas.py's first (each replica's `torch_threads` over GET /v1/replicas)."""

from __future__ import annotations

import threading

import pytest
import torch

from loragate.gateway.replicas.engine_replica import torch_threads


@pytest.mark.parametrize("cpus, threads", [(0.5, 1), (1, 1), (1.5, 1), (2, 2), (4.0, 4)])
def test_threads_follow_the_cpus(cpus, threads):
    assert torch_threads(cpus) == threads


def test_without_an_allotment_torch_keeps_its_count():
    assert torch_threads(None) == torch.get_num_threads()


def test_the_engine_thread_started_after_takes_the_count():
    """What the replica relies on: torch.set_num_threads before the engine thread starts
    holds on that thread, whatever OpenMP's default for new threads is."""
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)  # OpenMP's default on a 2-core machine
        torch.set_num_threads(torch_threads(0.5))
        seen = []

        def engine_thread():
            torch.ones(64, 64) @ torch.ones(64, 64)  # a parallel region first
            seen.append(torch.get_num_threads())

        thread = threading.Thread(target=engine_thread)
        thread.start()
        thread.join()
        assert seen == [1]
    finally:
        torch.set_num_threads(before)
