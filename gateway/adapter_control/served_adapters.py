"""Which adapters this replica serves, by key: the local side of the registry store.

The shared truth lives in the registry store (`loragate.registry`: in memory,
or Redis for many replicas). Each replica keeps its own copy as `AdapterRecord`s in an
`InMemoryAdapterRegistry`, so serving a known adapter never waits on, or fails with, the
store (lora_int_ids come from the store, so that every replica agrees on them);
`AdapterCatalog` keeps that copy in step with the store.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from loragate.adapters import LoRARequest
from loragate.registry import AdapterMetadata

# The record path shown for an uploaded adapter (a source's is its URI; a folder's, its path).
UPLOAD_PATH = "upload"


@dataclass(frozen=True)
class AdapterRecord:
    """One registration as this replica serves it: the store's metadata, the engine's
    LoRARequest for it, and `source`, how this replica learned of it ("rest" or
    "adapter_root": registered here; "registry": by another replica, or before this one
    started).

    The metadata's fields read through (`name` in its owner's namespace, `tenant` owning it
    or None for the operator, `public`, `rank`, `alpha`, `target_modules`, `sha256`,
    `size_bytes`, `kind`, `key`), so no field is declared twice.
    """

    meta: AdapterMetadata
    lora_request: LoRARequest
    source: str

    def __getattr__(self, name: str):
        if name == "meta":  # not set yet (copying): never recurse
            raise AttributeError(name)
        return getattr(self.meta, name)

    @property
    def display_path(self) -> str:
        """The adapter's folder relative to the adapter root, as the store keeps it."""
        return self.meta.path

    @property
    def created(self) -> int:
        return int(self.meta.created_at)


class InMemoryAdapterRegistry:
    """This replica's copy: a dict in this process, guarded for concurrent coroutines."""

    def __init__(self) -> None:
        self._records: dict[str, AdapterRecord] = {}
        # name -> keys of the public adapters of that name (the store keeps it to one; a
        # copy between two events may briefly hold two).
        self._public: dict[str, set[str]] = {}
        self._lock = asyncio.Lock()

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
