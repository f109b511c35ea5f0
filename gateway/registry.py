"""Which adapters this replica serves, by name: the local side of the registry store.

The shared truth lives in the registry store (`loragate.adapters.registry_store`: in memory,
or Redis for many replicas). Each replica keeps its own copy as `AdapterRecord`s in an
`AdapterRegistry` (`InMemoryAdapterRegistry`), so serving a known adapter never waits on,
or fails with, the store; `AdapterCatalog` keeps that copy in step with the store.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass
from itertools import count
from typing import Protocol

from loragate.adapters import LoRARequest

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")


def check_adapter_name(name: str, base_model: str) -> str:
    """Names appear in URLs and in the `model` field: short, plain, never the base model's."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(
            "name must be 1-128 characters of letters, digits, '.', '_', ':' or '-', "
            f"starting with a letter or digit; got {name!r}"
        )
    if name == base_model:
        raise ValueError(f"name {name!r} is the base model's name")
    return name


@dataclass(frozen=True)
class AdapterRecord:
    """One registration: the engine's LoRARequest plus what clients may be told about it.

    `tenant` owns it (None: the operator); `public` lets every tenant use it. `source` says
    how this replica learned of it: "rest" or "adapter_root" (registered here), "registry"
    (registered by another replica, or before this one started).
    """

    name: str
    lora_request: LoRARequest
    display_path: str
    rank: int
    alpha: float
    target_modules: tuple[str, ...]
    sha256: str
    size_bytes: int
    created: int
    source: str
    tenant: str | None = None
    public: bool = False


class AdapterRegistry(Protocol):
    async def new_id(self) -> int:
        """A lora_int_id never handed out before by this registry (the gateway itself takes
        ids from the registry store, so that every replica agrees on them)."""

    async def get(self, name: str) -> AdapterRecord | None: ...

    async def list(self) -> list[AdapterRecord]: ...

    async def put(self, record: AdapterRecord) -> AdapterRecord | None:
        """Store `record` under its name; returns the record it replaced, if any."""

    async def remove(self, name: str) -> AdapterRecord | None:
        """Forget `name`; returns its record, or None if there was none."""


class InMemoryAdapterRegistry:
    """The default store: a dict in this process, guarded for concurrent coroutines."""

    def __init__(self) -> None:
        self._records: dict[str, AdapterRecord] = {}
        self._ids = count(1)
        self._lock = asyncio.Lock()

    async def new_id(self) -> int:
        return next(self._ids)

    async def get(self, name: str) -> AdapterRecord | None:
        return self._records.get(name)

    async def list(self) -> list[AdapterRecord]:
        return sorted(self._records.values(), key=lambda r: r.name)

    async def put(self, record: AdapterRecord) -> AdapterRecord | None:
        async with self._lock:
            previous = self._records.get(record.name)
            self._records[record.name] = record
            return previous

    async def remove(self, name: str) -> AdapterRecord | None:
        async with self._lock:
            return self._records.pop(name, None)
