"""Backend choice shared by every op: Triton on CUDA tensors, torch everywhere else."""

from collections.abc import Callable

import torch

BACKENDS = ("triton", "torch")


def resolve_backend(backend: str | None, tensor: torch.Tensor) -> str:
    """Return the backend to run; None means 'whatever fits the tensor's device'."""
    if backend is None:
        return "triton" if tensor.is_cuda else "torch"
    if backend not in BACKENDS:
        raise ValueError(f"unknown kernel backend {backend!r}; expected None, 'triton' or 'torch'")
    return backend


def require(condition: bool, message: str | Callable[[], str]) -> None:
    """Raise a ValueError naming the problem when a shape or dtype contract is broken.

    Hot paths pass the message as a lambda: formatting it costs microseconds per call, and the
    engine makes hundreds of kernel calls per forward pass.
    """
    if not condition:
        raise ValueError(message() if callable(message) else message)


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Half-precision inputs accumulate in float32; float32/float64 keep their own precision."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def empty_output(shape: tuple[int, ...], like: torch.Tensor, dtype: torch.dtype | None = None):
    """Every op allocates its result here, so tests can poison it (fill with NaN) in one place."""
    return torch.empty(shape, dtype=dtype or like.dtype, device=like.device)


def dot_precision(dtype: torch.dtype) -> str | None:
    """tl.dot input precision: exact float32 products for float32 inputs (no TF32 rounding);
    None (Triton's default) for half-precision inputs, where the option does not apply."""
    return "ieee" if dtype == torch.float32 else None
