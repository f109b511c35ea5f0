"""Which adapters this replica serves, by key: the local side of the registry store.

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
from loragate.registry import adapter_key

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")


def check_adapter_name(name: str, base_model: str) -> str:
    """Names appear in URLs and in the `model` field: short, plain, and never the base
    model's in any case (a client that mistyped the case must not get an adapter)."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(
            "name must be 1-128 characters of letters, digits, '.', '_', ':' or '-', "
            f"starting with a letter or digit; got {name!r}"
        )
    if name.casefold() == base_model.casefold():
        raise ValueError(f"name {name!r} is the base model's name")
    return name


@dataclass(frozen=True)
class AdapterRecord:
    """One registration: the engine's LoRARequest plus what clients may be told about it.

    `name` is its name in its owner's namespace; `tenant` owns it (None: the operator);
    `public` lets every tenant use it by `name`. `source` says how this replica learned of
    it: "rest" or "adapter_root" (registered here), "registry" (registered by another
    replica, or before this one started).
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

    @property
    def key(self) -> str:
        """Unique across owners: `<tenant>/<name>`, or `<name>` for the operator's."""
        return adapter_key(self.tenant, self.name)


class AdapterRegistry(Protocol):
    async def new_id(self) -> int:
        """A lora_int_id never handed out before by this registry (the gateway itself takes
        ids from the registry store, so that every replica agrees on them)."""

    async def get(self, key: str) -> AdapterRecord | None: ...

    async def public(self, name: str) -> AdapterRecord | None:
        """The public adapter every tenant may call `name`, if any."""

    async def list(self) -> list[AdapterRecord]: ...

    async def put(self, record: AdapterRecord) -> AdapterRecord | None:
        """Store `record` under its key; returns the record it replaced, if any."""

    async def remove(self, key: str) -> AdapterRecord | None:
        """Forget `key`; returns its record, or None if there was none."""


class InMemoryAdapterRegistry:
    """The default store: a dict in this process, guarded for concurrent coroutines."""

    def __init__(self) -> None:
        self._records: dict[str, AdapterRecord] = {}
        # name -> keys of the public adapters of that name (the store keeps it to one; a
        # copy between two events may briefly hold two).
        self._public: dict[str, set[str]] = {}
        self._ids = count(1)
        self._lock = asyncio.Lock()

    async def new_id(self) -> int:
        return next(self._ids)

    async def get(self, key: str) -> AdapterRecord | None:
        return self._records.get(key)

    async def public(self, name: str) -> AdapterRecord | None:
        keys = self._public.get(name)
        if not keys:
            return None
        # The operator's first (its key is the name), then the first key in order.
        return self._records.get(name if name in keys else min(keys))

    async def list(self) -> list[AdapterRecord]:
        return sorted(self._records.values(), key=lambda r: r.key)

    async def put(self, record: AdapterRecord) -> AdapterRecord | None:
        async with self._lock:
            previous = self._pop(record.key)
            self._records[record.key] = record
            if record.public:
                self._public.setdefault(record.name, set()).add(record.key)
            return previous

    async def remove(self, key: str) -> AdapterRecord | None:
        async with self._lock:
            return self._pop(key)

    def _pop(self, key: str) -> AdapterRecord | None:
        record = self._records.pop(key, None)
        if record is not None and record.public:
            keys = self._public.get(record.name, set())
            keys.discard(key)
            if not keys:
                self._public.pop(record.name, None)
        return record
