"""Keeps this replica's copies (adapters, remembered tenant keys) in step with the store.

Two loops, for the server's life:
- watch: subscribed to the store's change events, it re-reads each changed adapter (so a
  registration or deletion on any replica shows here within a second) and forgets the
  keys of each changed tenant. Whenever it (re)subscribes, events may have been missed, so
  it resyncs everything first. If the subscription fails it subscribes again.
- monitor: every `resync_seconds` (faster while the store is down) it pings the store,
  notices a store that lost its data (`check_reset`), resyncs when the store's version
  moved (the safety net for a lost event), and writes usage counts that waited.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from loragate.gateway.adapter_control.catalog import AdapterCatalog
from loragate.gateway.errors import RegistryDownError
from loragate.gateway.store_seam import StoreSeam
from loragate.gateway.tenancy.auth import Authenticator
from loragate.gateway.tenancy.usage_meter import UsageMeter
from loragate.registry import ChangeEvent, ChangeKind

log = logging.getLogger(__name__)

_ADAPTER_EVENTS = (
    ChangeKind.ADAPTER_REGISTERED,
    ChangeKind.ADAPTER_UPDATED,
    ChangeKind.ADAPTER_DELETED,
)


class RegistrySync:
    def __init__(
        self,
        store: StoreSeam,
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
        self.data_lost_at: float | None = None  # when a loss of the store's data was noticed
        self._version: int | None = None
        self._tasks: list[asyncio.Task] = []
        self._first_attempt = asyncio.Event()
        self._stopping = False
        self.on_subscribed = on_subscribed

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
        """Match the store's adapters (if its version moved, or `force`)."""
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
                force = True
            version = await self.store.version()
            if not force and version == self._version:
                return
            metas = await self.store.list_adapters()
            await self.catalog.reconcile(metas)
            self._version = version

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
        if event.kind in _ADAPTER_EVENTS:
            async with self.catalog.lock:
                meta = await self.store.get_adapter(event.name)
                await self.catalog.refresh(event.name, meta)
        else:
            self.auth.forget_tenant(event.name)

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
