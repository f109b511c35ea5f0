"""This replica's copy of the registry store's adapters, and the rules for keeping it in step.

Requests are served from the copy alone, so they neither wait on the store nor fail when
it is down. Every change to the copy happens under one lock, each time right after a read
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
from loragate.gateway.adapter_control.paths import AdapterPathError, resolve_adapter_dir
from loragate.gateway.adapter_control.records import AdapterRecord, InMemoryAdapterRegistry
from loragate.gateway.adapter_control.store_engine import UPLOAD_PATH, object_of, store_path
from loragate.gateway.tenancy.principal import Principal
from loragate.registry import AdapterMetadata, adapter_key, split_adapter_key

log = logging.getLogger(__name__)


class AdapterCatalog:
    def __init__(
        self,
        adapter_root: Path | None,
        retire: Callable[[AdapterRecord], Awaitable[None]],
    ):
        self.root = adapter_root
        self.lock = asyncio.Lock()
        self.orphans: set[str] = set()
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
            return await self._local.get(name) if caller.is_operator else None
        own = await self._local.get(adapter_key(caller.tenant, bare))
        return own if own is not None else await self._local.public(bare)

    async def owned_by(self, tenant: str) -> list[AdapterRecord]:
        """The adapters `tenant` owns, as this replica knows them."""
        return [r for r in await self._local.list() if r.tenant == tenant]

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

    async def reconcile(self, metas: list[AdapterMetadata]) -> None:
        """Make the copy match the store's full list (orphans excepted)."""
        keys = {m.key for m in metas}
        for record in await self._local.list():
            if record.key not in keys and record.key not in self.orphans:
                await self._drop(record.key)
        for meta in metas:
            await self.apply(meta)

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
