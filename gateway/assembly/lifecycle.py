"""What the gateway does as it starts and stops, around the engine the lifespan owns: the
registry store checked and followed, adapters preloaded and registered, leases kept alive;
then everything stopped in order, the accounting under way let finish (briefly)."""

from __future__ import annotations

import asyncio
import logging

from loragate.engine import ModelInfo
from loragate.gateway.adapter_control.manager import AdapterManager
from loragate.gateway.adapter_control.sync import RegistrySync
from loragate.gateway.registry_care.care import RegistryCare
from loragate.gateway.registry_seam import RegistrySeam
from loragate.gateway.serving.accounting import Accounting
from loragate.gateway.settings import GatewaySettings
from loragate.gateway.settings_checks import lora_modules
from loragate.gateway.tenancy.quotas import QuotaKeeper
from loragate.gateway.tenancy.usage_meter import UsageMeter

log = logging.getLogger(__name__)


class Lifecycle:
    def __init__(
        self,
        settings: GatewaySettings,
        model: ModelInfo,
        store: RegistrySeam,
        care: RegistryCare,
        sync: RegistrySync,
        adapters: AdapterManager,
        quotas: QuotaKeeper,
        usage_meter: UsageMeter,
        accounting: Accounting,
    ):
        self.settings = settings
        self.model = model
        self.store = store
        self.care = care
        self.sync = sync
        self.adapters = adapters
        self.quotas = quotas
        self.usage_meter = usage_meter
        self.accounting = accounting
        self._started = False
        self._preloads: set[asyncio.Task] = set()
        self._lease_keeper: asyncio.Task | None = None

    async def startup(self) -> None:
        await self.care.check_persistence()  # RegistryNotDurable stops the start here
        await self.sync.start()
        self.care.start()
        self.adapters.start()
        if self.settings.preload_adapters and self.model.lora_enabled:
            await self._preload()
        for name, path in lora_modules(self.settings.lora_modules):
            await self.adapters.register(name, path, source="cli", anywhere=True, replace=True)
            log.info("registered --lora-modules adapter %s from %s", name, path)
        self._started = True
        self._lease_keeper = asyncio.create_task(self.quotas.keep_leases_alive())

    async def _preload(self, only: set[str] | None = None) -> None:
        names = await self.adapters.preload_root(only)
        if names:
            log.info("preloaded %d adapters from %s", len(names), self.settings.adapter_root)

    def preload_waiting_folders(self) -> None:
        """The store answers again (the sync's `on_subscribed`): register the folders that
        waited for it, once start-up is done, one preload at a time."""
        waiting = set(self.adapters.preload_waiting)
        if self._started and waiting and not self._preloads:
            task = asyncio.create_task(self._preload(waiting), name="preload")
            self._preloads.add(task)
            task.add_done_callback(self._preloads.discard)

    async def shutdown(self) -> None:
        """Stop the loops; let accounting already under way finish (briefly), then close."""
        await self.care.stop()
        await self.sync.stop()
        self.quotas.stop()
        if self._lease_keeper is not None:
            self._lease_keeper.cancel()
        under_way = self.accounting.under_way | self._preloads
        if under_way:
            await asyncio.wait(list(under_way), timeout=5)
        await self.usage_meter.flush()
        await self.adapters.close()
        await self.store.close()
