"""Why an adapter was refused: one exception type per kind of problem.

Every error names the file and the config field (or tensor key) at fault, and keeps
them as attributes so the gateway can answer a structured 400 without parsing text.
All derive from ``AdapterError(ValueError)``: callers that only care "is this adapter
bad?" catch one type.
"""

from __future__ import annotations

from pathlib import Path


class AdapterError(ValueError):
    """An adapter directory that loragate will not serve."""

    def __init__(self, message: str, *, path: str | Path | None = None, field: str | None = None):
        prefix = f"{path}: " if path is not None else ""
        super().__init__(prefix + message)
        self.path = None if path is None else str(path)
        self.field = field


class AdapterNotFoundError(AdapterError, FileNotFoundError):
    """The directory, its adapter_config.json or its adapter_model.safetensors is missing."""


class PickleWeightsError(AdapterError):
    """Only pickle weights (.bin/.pt/.pth/.ckpt) were found; loading them could run code."""


class AdapterConfigError(AdapterError):
    """adapter_config.json is unreadable, not JSON, or a field has the wrong type or value."""


class UnsupportedAdapterError(AdapterError):
    """A valid PEFT adapter using a feature loragate does not serve (DoRA, biases, ...)."""


class AdapterRankError(UnsupportedAdapterError):
    """The adapter's rank is above the server's max_lora_rank."""


class UnsupportedTargetModuleError(UnsupportedAdapterError):
    """The adapter targets a module that has no LoRA slot (embeddings, lm_head, ...)."""


class CorruptWeightsError(AdapterError):
    """adapter_model.safetensors cannot be parsed."""


class AdapterShapeError(AdapterError):
    """Tensors that do not fit the base model: wrong dims, rank, layer, or a lone A or B."""


class BaseModelMismatchError(AdapterError):
    """The adapter was trained for a different base model (raised only in strict mode)."""


class BaseModelMismatchWarning(UserWarning):
    """The adapter names a different base model; served anyway because strict mode is off."""


class AdapterTooLargeError(AdapterError):
    """The adapter takes more memory than a whole cache tier holds (the CPU tier or the
    device slots, adapters/tier_budget.py): it could never be served. ``size`` and ``limit``
    are the bytes it takes and the bytes that tier holds."""

    def __init__(self, message: str, *, size: int, limit: int, **kw):
        super().__init__(message, **kw)
        self.size, self.limit = size, limit


class AdapterChangedError(AdapterError):
    """A request's adapter files changed after it was admitted, and the weights it was admitted
    with are no longer in memory: it cannot run with them, and never runs with others."""


class AdapterLoadTimeoutError(AdapterError):
    """Reading and validating the adapter's files took longer than the server allows."""


class AdapterNotInMemory(LookupError):
    """The weights a request was admitted under are in no memory tier yet: a loader thread
    reads them while the request waits (the engine's step never reads a file). Not an
    AdapterError: nothing is wrong with the adapter."""
