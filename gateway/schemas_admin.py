"""Bodies of the adapter-management and health routes."""

from __future__ import annotations

import msgspec


class RegisterAdapterRequest(msgspec.Struct, kw_only=True):
    """`path` is a directory under the server's --adapter-root (relative or absolute)."""

    name: str
    path: str


class LoadLoRAAdapterRequest(msgspec.Struct, kw_only=True):
    """vLLM's body for POST /v1/load_lora_adapter."""

    lora_name: str
    lora_path: str


class UnloadLoRAAdapterRequest(msgspec.Struct, kw_only=True):
    """vLLM's body for POST /v1/unload_lora_adapter."""

    lora_name: str
    lora_int_id: int | None = None


class AdapterInfo(msgspec.Struct, kw_only=True):
    """A registered adapter. `path` is relative to the adapter root, never absolute."""

    name: str
    id: int
    object: str = "adapter"
    parent: str
    path: str
    rank: int
    alpha: float
    target_modules: list[str]
    sha256: str
    size_bytes: int
    created: int
    source: str


class AdapterList(msgspec.Struct, kw_only=True):
    object: str = "list"
    data: list[AdapterInfo]


class DeletedAdapter(msgspec.Struct, kw_only=True):
    name: str
    object: str = "adapter"
    deleted: bool = True


class HealthStatus(msgspec.Struct, kw_only=True):
    status: str
    model: str
    detail: str | None = None
