"""This replica's copy of the registry store's adapters, and the rules for keeping it in step.

Requests are served from the copy alone, so they neither wait on the store nor fail when
it is down. Every change to the copy happens under one lock, each time right after a read
of the store (or a write to it) made under the same lock: reads and changes are therefore
applied in the order the store saw them, whichever path (a change event, a periodic
resync, this replica's own registration) brought them.

After the store lost its data (Redis restarted empty), what this replica knew is kept as
"orphans": still served, until the same name is registered again (the store's record then
wins) or deleted here. A resync never drops an orphan.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path

from loragate.adapters import LoRARequest
from loragate.adapters.registry_store import AdapterMetadata
from loragate.gateway.adapter_paths import AdapterPathError, resolve_adapter_dir
from loragate.gateway.registry import AdapterRecord, InMemoryAdapterRegistry
from loragate.gateway.tenancy import Principal

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
    async def get(self, name: str) -> AdapterRecord | None:
        return await self._local.get(name)

    async def visible(self, caller: Principal, name: str) -> AdapterRecord | None:
        record = await self._local.get(name)
        return record if record is not None and caller.can_see(record) else None

    async def list(self, caller: Principal) -> list[AdapterRecord]:
        return [r for r in await self._local.list() if caller.can_see(r)]

    # ---- changes: call with `lock` held -------------------------------------------------
    async def apply(
        self, meta: AdapterMetadata, source: str = "registry", lora: LoRARequest | None = None
    ) -> AdapterRecord | None:
        """Serve what `meta` describes (None if this replica cannot); retires what it replaces."""
        self.orphans.discard(meta.name)
        current = await self._local.get(meta.name)
        if meta.status != "ready":
            await self._drop(meta.name)
            return None
        if current is not None and current.lora_request.lora_int_id == meta.lora_int_id:
            # The same registration: its sharing may have changed, or its files (in place).
            updated = replace(
                current,
                tenant=meta.tenant,
                public=meta.public,
                rank=meta.rank,
                alpha=meta.alpha,
                target_modules=tuple(meta.target_modules),
                sha256=meta.sha256,
                size_bytes=meta.size_bytes,
            )
            if updated != current:
                await self._local.put(updated)
            return updated
        record = self._record(meta, source, lora)
        if record is None:
            await self._drop(meta.name)
            return None
        previous = await self._local.put(record)
        if previous is not None:
            self._retire_later(previous)
        return record

    async def refresh(self, name: str, meta: AdapterMetadata | None) -> None:
        """`meta` is what the store holds for `name` now (None: nothing)."""
        if meta is not None:
            await self.apply(meta)
        elif name not in self.orphans:
            await self._drop(name)

    async def reconcile(self, metas: list[AdapterMetadata]) -> None:
        """Make the copy match the store's full list (orphans excepted)."""
        names = {m.name for m in metas}
        for record in await self._local.list():
            if record.name not in names and record.name not in self.orphans:
                await self._drop(record.name)
        for meta in metas:
            await self.apply(meta)

    async def remove(self, name: str) -> AdapterRecord | None:
        """Stop serving `name` here; the caller retires the record it gets back."""
        self.orphans.discard(name)
        return await self._local.remove(name)

    async def drop_owned_by(self, tenant: str) -> None:
        """The tenant was deleted: its adapters go (events would bring the same news)."""
        for record in await self._local.list():
            if record.tenant == tenant:
                self.orphans.discard(record.name)
                await self._drop(record.name)

    async def orphan_everything(self) -> int:
        """The store lost its data: keep serving everything known, as orphans."""
        self.orphans = {r.name for r in await self._local.list()}
        return len(self.orphans)

    async def _drop(self, name: str) -> None:
        record = await self._local.remove(name)
        if record is not None:
            log.info("adapter %s is no longer registered; retiring it here", name)
            self._retire_later(record)

    def _retire_later(self, record: AdapterRecord) -> None:
        task = asyncio.create_task(self._retire(record))
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    def _record(
        self, meta: AdapterMetadata, source: str, lora: LoRARequest | None
    ) -> AdapterRecord | None:
        if lora is None:
            try:
                directory = resolve_adapter_dir(self.root, meta.path)
            except AdapterPathError as exc:
                log.warning("adapter %s cannot be served by this replica: %s", meta.name, exc)
                return None
            lora = LoRARequest(meta.name, meta.lora_int_id, str(directory))
        return AdapterRecord(
            name=meta.name,
            lora_request=lora,
            display_path=meta.path,
            rank=meta.rank,
            alpha=meta.alpha,
            target_modules=tuple(meta.target_modules),
            sha256=meta.sha256,
            size_bytes=meta.size_bytes,
            created=int(meta.created_at),
            source=source,
            tenant=meta.tenant,
            public=meta.public,
        )

    async def close(self) -> None:
        for task in list(self._retiring):
            task.cancel()
