"""Kernel-test fixtures: every op's freshly allocated output starts as NaN; on a GPU machine
the tests parametrized with backend='triton' build their tensors on CUDA."""

import pytest
import torch

from loragate.kernels import _backend

CUDA = torch.cuda.is_available()


def _nan_output(shape, like, dtype=None):
    return torch.full(shape, float("nan"), dtype=dtype or like.dtype, device=like.device)


@pytest.fixture(autouse=True)
def poisoned_outputs(monkeypatch):
    """Outputs the kernels allocate are NaN-filled, so an element a kernel forgets shows up."""
    monkeypatch.setattr(_backend, "empty_output", _nan_output)


@pytest.fixture(autouse=True)
def triton_tensors_on_cuda(request):
    """Without a GPU the Triton kernels run under the interpreter on CPU tensors; with one,
    the same tests run them compiled, on CUDA tensors (the default device while they run)."""
    params = getattr(request.node, "callspec", None)
    if CUDA and params is not None and params.params.get("backend") == "triton":
        torch.set_default_device("cuda")
    try:
        yield
    finally:
        torch.set_default_device(None)
