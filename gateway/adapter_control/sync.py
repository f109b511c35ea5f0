"""Keeps this replica's copies (adapters, remembered tenant keys) in step with the store.

It never reads the whole table. It keeps the store version it has caught up to, and on
each change reads the store's change log after that version (`changes_since`, one read),
then, for each changed adapter this replica holds, that one record (a key it does not
hold costs nothing: only what it remembered missing about the key is forgotten); each
changed tenant's remembered keys are forgotten. A replica that starts reads the version
and nothing else: the catalog reads each adapter the first time a request names it. Only
when the log no longer reaches back to its version (trimmed after a long outage, or a
store that lost its data) does it re-read what it holds, a batch of records in each read.
A restored backup is one change in the log (REGISTRY_RESTORED, however many records it
brought): it makes the replica re-read what it holds the same way (and the tenants it kept
serving since the store lost its data), forget every name it remembered missing, and check
every remembered key again; nothing else is read.

Two loops, for the server's life:
- watch: subscribed to the store's change events, each of which makes it catch up from
  the log (so a registration or deletion on any replica shows here within a second).
  Whenever it (re)subscribes, events may have been missed, so it catches up first. If the
  subscription fails it subscribes again.
- monitor: every `resync_seconds` (faster while the store is down) it pings the store,
  notices a store that lost its data (`check_reset`), catches up when the store's version
  moved (the safety net for a lost event), and writes usage counts that waited.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from loragate.gateway.adapter_control.catalog import AdapterCatalog
from loragate.gateway.errors import RegistryDownError
from loragate.gateway.registry_seam import RegistrySeam
from loragate.gateway.tenancy.auth import Authenticator
from loragate.gateway.tenancy.usage_meter import UsageMeter
from loragate.registry import ChangeEvent, ChangeKind

log = logging.getLogger(__name__)

REREAD_BATCH = 1000  # adapters re-read in one store read when the change log falls short

_ADAPTER_EVENTS = (
    ChangeKind.ADAPTER_REGISTERED,
    ChangeKind.ADAPTER_UPDATED,
    ChangeKind.ADAPTER_DELETED,
)


class RegistrySync:
    def __init__(
        self,
        store: RegistrySeam,
        catalog: AdapterCatalog,
        auth: Authenticator,
        usage: UsageMeter,
        resync_seconds: float,
        retry_seconds: float = 0.25,
        on_subscribed: Callable[[], None] | None = None,
    ):
        """`on_subscribed` is called (on the loop) each time the subscription is up and the
        copy resynced."""
        self.store = store
        self.health = store.health
        self.catalog = catalog
        self.auth = auth
        self.usage = usage
        self.resync_seconds = resync_seconds
        self.retry_seconds = min(retry_seconds, resync_seconds)
        self.resets_seen = 0
        self.restores_seen = 0  # restored backups this replica caught up with
        self.data_lost_at: float | None = None  # when a loss of the store's data was noticed
        self._version: int | None = None  # the store's version the copy has caught up to
        self.records_read = 0  # adapter records the sync read (each changed one it holds)
        self._tasks: list[asyncio.Task] = []
        self._first_attempt = asyncio.Event()
        self._stopping = False
        self.on_subscribed = on_subscribed

    @property
    def version(self) -> int | None:
        """The store version this replica's copy has caught up to (None before start)."""
        return self._version

    async def start(self) -> None:
        """Read the store once and subscribe to its changes (if it answers; else keep trying
        in the background), so a server that has started misses no change."""
        try:
            if await self.store.open():
                log.info("registry store at %s holds no data yet", self.health.where)
            await self.resync(force=True)
        except RegistryDownError:
            log.error("starting without the registry store; retrying in the background")
        self._tasks = [
            asyncio.create_task(self._watch(), name="registry-watch"),
            asyncio.create_task(self._monitor(), name="registry-monitor"),
        ]
        await self._first_attempt.wait()

    async def stop(self) -> None:
        """Cancel both loops. They also check `_stopping`: a client library may turn a
        cancellation that lands in a store call into an error, which the loops survive."""
        self._stopping = True
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=5)

    async def resync(self, force: bool = False) -> None:
        """Catch up with the store's changes (if its version moved, or `force`)."""
        async with self.catalog.lock:
            reset = await self.store.check_reset()
            if reset:
                self.resets_seen += 1
                self.data_lost_at = time.time()
                adapters = await self.catalog.orphan_everything()
                tenants = self.auth.orphan_everything()
                log.error(
                    "registry store at %s LOST ITS DATA (restarted empty?): still serving the "
                    "%d adapters and %d tenants known here until they are registered again",
                    self.health.where,
                    adapters,
                    tenants,
                )
                version = await self.store.version()
                await self._reread_held()
                self._version = version
                return
            if self._version is None:  # starting: nothing held yet, nothing to read
                self._version = await self.store.version()
                return
            if force or await self.store.version() != self._version:
                await self._catch_up()

    async def _catch_up(self) -> None:
        """Apply the logged changes after `_version` (call with the catalog's lock held)."""
        while True:
            changes = await self.store.changes_since(self._version)
            if not changes.complete:
                log.warning(
                    "registry change log does not reach back to version %d (now %d): "
                    "re-reading the %d adapters held here",
                    self._version,
                    changes.latest,
                    len(await self.catalog.held()),
                )
                await self._reread_held()
                self._version = changes.latest
                return
            for event in changes.changes:
                await self._apply_locked(event)
            self._version = changes.version
            if changes.version >= changes.latest:
                return

    async def _reread_held(self) -> None:
        """Forget every miss and tenant key; re-read the adapters held here, a batch of
        REREAD_BATCH in each read (call with the catalog's lock held)."""
        self.catalog.misses.clear()
        self.auth.recheck_all()
        held = await self.catalog.held()
        for start in range(0, len(held), REREAD_BATCH):
            keys = held[start : start + REREAD_BATCH]
            metas = await self.store.get_adapters(keys)
            self.records_read += len(keys)
            for key, meta in zip(keys, metas, strict=True):
                await self.catalog.refresh(key, meta)

    async def _apply_locked(self, event: ChangeEvent) -> None:
        if event.kind == ChangeKind.REGISTRY_RESTORED:
            self.restores_seen += 1
            await self._reread_held()
            for tenant in sorted(self.auth.orphans):  # kept since a loss: restored now?
                if await self.store.get_tenant(tenant) is not None:
                    self.auth.forget_tenant(tenant)
            return
        if event.kind not in _ADAPTER_EVENTS:
            self.auth.forget_tenant(event.name)
            return
        self.catalog.misses.forget(event.name)
        if event.name in self.catalog.orphans or await self.catalog.get(event.name) is not None:
            await self._refresh(event.name)

    async def _refresh(self, key: str) -> None:
        self.records_read += 1
        await self.catalog.refresh(key, await self.store.get_adapter(key))

    async def _watch(self) -> None:
        while not self._stopping:
            try:
                async with self.store.watch() as events:
                    self.auth.recheck_all()  # events may have been missed while not watching
                    await self.resync(force=True)
                    self.health.watching = True
                    self._first_attempt.set()
                    await self.usage.flush()
                    if self.on_subscribed is not None:
                        self.on_subscribed()
                    async for event in events:
                        if self._stopping:
                            return
                        await self._apply(event)
            except RegistryDownError:
                pass  # the seam noted it in `health`
            except Exception:
                log.exception("registry watch failed; subscribing again")
            self.health.watching = False
            self._first_attempt.set()
            await asyncio.sleep(self.retry_seconds)

    async def _apply(self, event: ChangeEvent) -> None:
        """An event says the store changed: read the log's changes since the last one."""
        async with self.catalog.lock:
            if self._version is None:
                self._version = await self.store.version()
            else:
                await self._catch_up()

    async def _monitor(self) -> None:
        while not self._stopping:
            healthy = self.health.reachable
            await asyncio.sleep(self.resync_seconds if healthy else self.retry_seconds)
            try:
                await self.store.ping()
                await self.resync()
                await self.usage.flush()
            except RegistryDownError:
                pass
            except Exception:
                log.exception("registry resync failed; trying again")
