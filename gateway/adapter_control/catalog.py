"""This replica's copy of the registry store's adapters, and the rules for keeping it in step.

The copy holds what this replica was asked for: an adapter is read from the store the
first time a request names it (one read, by key or by public name) and served from the
copy after, kept in step by the sync's change log (`sync`), so a replica starting on
100,000 adapters reads none of them. A known adapter neither waits on the store nor fails
when it is down; while the store is down, one never read here is missing, as it is to a
replica that started during the outage.

Every change to the copy happens under one lock, each time right after a read
of the store (or a write to it) made under the same lock: reads and changes are therefore
applied in the order the store saw them, whichever path (a change event, a periodic
resync, this replica's own registration) brought them.

After the store lost its data (Redis restarted empty), what this replica knew is kept as
"orphans": still served, until the same name is registered again (the store's record then
wins) or deleted here. A resync never drops an orphan.

The copy is keyed like the store, by adapter key (`<tenant>/<name>`, or `<name>` for the
operator's); `visible` resolves a name the way its caller's namespace reads it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from urllib.parse import urlsplit

from loragate.adapters import LoRARequest
from loragate.engine import object_of, store_path
from loragate.gateway.adapter_control.misses import Misses
from loragate.gateway.adapter_control.paths import AdapterPathError, resolve_adapter_dir
from loragate.gateway.adapter_control.served_adapters import (
    UPLOAD_PATH,
    AdapterRecord,
    InMemoryAdapterRegistry,
)
from loragate.gateway.errors import RegistryDownError
from loragate.gateway.registry_seam import RegistrySeam
from loragate.gateway.tenancy.principal import Principal
from loragate.registry import AdapterMetadata, adapter_key, split_adapter_key

log = logging.getLogger(__name__)


class AdapterCatalog:
    def __init__(
        self,
        adapter_root: Path | None,
        retire: Callable[[AdapterRecord], Awaitable[None]],
        store: RegistrySeam | None = None,
    ):
        """`store`: where to read what the copy does not hold yet (None: the copy is all
        there is)."""
        self.root = adapter_root
        self.store = store
        self.lock = asyncio.Lock()
        self.orphans: set[str] = set()
        self.misses = Misses()
        self._local = InMemoryAdapterRegistry()
        self._retire = retire
        self._retiring: set[asyncio.Task] = set()

    # ---- reads (no lock: a dict lookup is atomic on the event loop) ----------------------
    async def get(self, key: str) -> AdapterRecord | None:
        return await self._local.get(key)

    async def visible(self, caller: Principal, name: str) -> AdapterRecord | None:
        """The adapter `name` means to `caller`: in its own namespace, else a public one.

        Only the operator names keys (`<tenant>/<name>`); to a tenant such a name is
        missing, whoever it would name, so no answer depends on another tenant's names.
        """
        try:
            tenant, bare = split_adapter_key(name)
        except ValueError:
            return None
        if tenant is not None:
            return await self.lookup(name) if caller.is_operator else None
        own = await self.lookup(adapter_key(caller.tenant, bare))
        return own if own is not None else await self.public(bare)

    async def lookup(self, key: str) -> AdapterRecord | None:
        """The record of `key`, read from the store into the copy the first time it is
        asked for (one read; a key the store lacks is remembered in `misses`)."""
        record = await self._local.get(key)
        if record is not None or self.store is None or self.misses.has_key(key):
            return record
        async with self.lock:
            record = await self._local.get(key)
            if record is None and not self.misses.has_key(key):
                try:
                    meta = await self.store.get_adapter(key)
                except RegistryDownError:
                    return None  # not known here: missing until the store answers
                record = None if meta is None else await self.apply(meta)
                if record is None:
                    self.misses.add_key(key)
            return record

    async def public(self, name: str) -> AdapterRecord | None:
        """The public adapter called `name`, read from the store the first time."""
        record = await self._local.public(name)
        if record is not None or self.store is None or self.misses.has_public(name):
            return record
        async with self.lock:
            record = await self._local.public(name)
            if record is None and not self.misses.has_public(name):
                try:
                    meta = await self.store.public_adapter(name)
                except RegistryDownError:
                    return None
                if meta is not None:
                    await self.apply(meta)
                record = await self._local.public(name)
                if record is None:
                    self.misses.add_public(name)
            return record

    async def held(self) -> list[str]:
        """The keys this replica holds a record of."""
        return [r.key for r in await self._local.list()]

    async def list(self, caller: Principal) -> list[AdapterRecord]:
        """What `caller` may name: everything for the operator; a tenant's own adapters,
        then the public ones its own names do not hide."""
        records = await self._local.list()
        if caller.is_operator:
            return records
        own = [r for r in records if r.tenant == caller.tenant]
        mine = {r.name for r in own}
        shared = {}
        for r in records:
            if r.public and r.name not in mine and r.name not in shared:
                shared[r.name] = await self._local.public(r.name)
        return sorted(own + list(shared.values()), key=lambda r: r.name)

    # ---- changes: call with `lock` held -------------------------------------------------
    async def apply(
        self, meta: AdapterMetadata, source: str = "registry", lora: LoRARequest | None = None
    ) -> AdapterRecord | None:
        """Serve what `meta` describes (None if this replica cannot); retires what it replaces."""
        self.orphans.discard(meta.key)
        current = await self._local.get(meta.key)
        if meta.status != "ready":
            await self._drop(meta.key)
            return None
        if current is not None and current.lora_request.lora_int_id == meta.lora_int_id:
            # The same registration: its sharing may have changed, or its files (in place;
            # served here from the store: the new files' object).
            updated = replace(current, meta=meta)
            fetched = object_of(current.lora_request)
            if fetched is not None and meta.store_object not in (None, fetched):
                path = store_path(meta.store_object)
                updated = replace(
                    updated, lora_request=replace(current.lora_request, lora_path=path)
                )
            if updated != current:
                await self._local.put(updated)
            return updated
        record = self._record(meta, source, lora)
        if record is None:
            await self._drop(meta.key)
            return None
        previous = await self._local.put(record)
        if previous is not None:
            self._retire_later(previous)
        return record

    async def refresh(self, key: str, meta: AdapterMetadata | None) -> None:
        """`meta` is what the store holds for `key` now (None: nothing)."""
        if meta is not None:
            await self.apply(meta)
        elif key not in self.orphans:
            await self._drop(key)

    async def remove(self, key: str) -> AdapterRecord | None:
        """Stop serving `key` here; the caller retires the record it gets back."""
        self.orphans.discard(key)
        return await self._local.remove(key)

    async def drop_owned_by(self, tenant: str) -> None:
        """The tenant was deleted: its adapters go (events would bring the same news)."""
        for record in await self._local.list():
            if record.tenant == tenant:
                self.orphans.discard(record.key)
                await self._drop(record.key)

    async def orphan_everything(self) -> int:
        """The store lost its data: keep serving everything known, as orphans."""
        self.orphans = {r.key for r in await self._local.list()}
        self.misses.clear()
        return len(self.orphans)

    async def _drop(self, key: str) -> None:
        record = await self._local.remove(key)
        if record is not None:
            log.info("adapter %s is no longer registered; retiring it here", key)
            self._retire_later(record)

    def _retire_later(self, record: AdapterRecord) -> None:
        task = asyncio.create_task(self._retire(record))
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    def _record(
        self, meta: AdapterMetadata, source: str, lora: LoRARequest | None
    ) -> AdapterRecord | None:
        if lora is None and meta.store_object is not None and not self._folder_here(meta):
            # Uploaded, from a source, or a folder this replica does not have: by hash.
            lora = LoRARequest(meta.key, meta.lora_int_id, store_path(meta.store_object))
        if lora is None:
            try:
                directory = resolve_adapter_dir(self.root, meta.path)
            except AdapterPathError as exc:
                log.warning("adapter %s cannot be served by this replica: %s", meta.key, exc)
                return None
            lora = LoRARequest(meta.key, meta.lora_int_id, str(directory))
        return AdapterRecord(meta, lora, source)

    def _folder_here(self, meta: AdapterMetadata) -> bool:
        """Whether `meta` is a folder of the adapter root that this replica has (served from
        the folder, whose files may change in place, rather than from the store)."""
        if self.root is None or meta.path == UPLOAD_PATH or urlsplit(meta.path).scheme:
            return False
        try:
            resolve_adapter_dir(self.root, meta.path)
        except AdapterPathError:
            return False
        return True

    async def close(self) -> None:
        for task in list(self._retiring):
            task.cancel()
