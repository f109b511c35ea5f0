"""Kernel-test fixtures: every op's freshly allocated output starts as NaN."""

import pytest
import torch

from loragate.kernels import _backend


def _nan_output(shape, like, dtype=None):
    return torch.full(shape, float("nan"), dtype=dtype or like.dtype, device=like.device)


@pytest.fixture(autouse=True)
def poisoned_outputs(monkeypatch):
    """Outputs the kernels allocate are NaN-filled, so an element a kernel forgets shows up."""
    monkeypatch.setattr(_backend, "empty_output", _nan_output)
