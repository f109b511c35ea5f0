"""An adapter's files changed in place: its registry record follows the weights served.

The engine runs each request with the files' content as it was at admission, and tells its
listeners when it admits one under weights other than those it last admitted for the name
(EngineClient.on_adapter_weights_changed). The first request after a change is served the
new weights; the engine holds its first output until the listener returns, so before it is
answered, the registry's record (sha256, size, rank, alpha, targets) is updated, once per
change, and every replica shows what is served.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path

import msgspec

from loragate.adapters import AdapterError, LoRAAdapter
from loragate.engine import AdapterWeightsChanged, object_of
from loragate.gateway.adapter_control.adapter_store_objects import AdapterObjects
from loragate.gateway.adapter_control.catalog import AdapterCatalog
from loragate.gateway.adapter_control.served_adapters import AdapterRecord
from loragate.gateway.errors import RegistryDownError
from loragate.gateway.registry_seam import RegistrySeam
from loragate.registry import AdapterWeights

log = logging.getLogger(__name__)


class WeightsUpdates:
    def __init__(
        self,
        catalog: AdapterCatalog,
        store: RegistrySeam,
        engine,
        load_timeout,
        objects: AdapterObjects | None = None,
    ):
        self.catalog = catalog
        self.store = store
        self.engine = engine
        self.load_timeout = load_timeout
        self.objects = objects  # keeps the new files in the adapter store too, if it has one
        self._running: dict[str, asyncio.Task] = {}
        self._stop_listening = None

    def start(self) -> None:
        """Follow the engine's changes of weights behind a name from now on."""
        if self._stop_listening is None:
            self._stop_listening = self.engine.on_adapter_weights_changed(self.weights_changed)

    def stop(self) -> None:
        if self._stop_listening is not None:
            self._stop_listening()
            self._stop_listening = None

    async def weights_changed(self, event: AdapterWeightsChanged) -> None:
        """The engine admitted a request under ``event.sha256``: if the registry records
        other weights for that registration, its files changed: record the new ones."""
        lora = event.lora_request
        record = await self.catalog.get(lora.lora_name)
        if record is None or record.lora_request != lora or record.sha256 == event.sha256:
            return
        task = self._running.get(lora.lora_name)
        if task is None:  # one update at a time per name
            task = asyncio.create_task(self._record_new_weights(record))
            self._running[lora.lora_name] = task
            task.add_done_callback(lambda _: self._running.pop(lora.lora_name, None))
        await asyncio.shield(task)

    async def _record_new_weights(self, record: AdapterRecord) -> None:
        try:
            adapter = await self.engine.add_adapter(record.lora_request, timeout=self.load_timeout)
        except AdapterError as exc:  # broken since: requests sent now get the 400
            log.warning("adapter %s: its files changed and now fail to load: %s", record.name, exc)
            return
        if adapter.sha256 == record.sha256:
            return  # changed back meanwhile
        try:
            async with _store_copy_of(self.objects, record, adapter.sha256) as oid:
                weights = msgspec.structs.replace(weights_of(adapter), store_object=oid)
                async with self.catalog.lock:
                    meta = await self.store.update_adapter(
                        record.key, lora_int_id=record.lora_request.lora_int_id, weights=weights
                    )
                    if meta is not None:
                        await self.catalog.apply(meta)
            if self.objects is not None and record.store_object not in (None, oid):
                await self.objects.collect(record.store_object)  # the old files, if unused
        except RegistryDownError:
            log.warning(
                "adapter %s: its files changed (sha256 %s) but the registry is unreachable; "
                "the new weights are served and the record is updated on a later request",
                record.name,
                adapter.sha256,
            )
            return
        log.info(
            "adapter %s: its files changed in place; registry now records sha256 %s (was %s)",
            record.name,
            adapter.sha256,
            record.sha256,
        )


def _store_copy_of(objects, record: AdapterRecord, sha256: str):
    """The new files kept in the store (their object id) for a folder the store mirrors."""
    if objects is None or object_of(record.lora_request) is not None:
        return contextlib.nullcontext(None)
    return objects.imported(Path(record.lora_request.lora_path), sha256)


def weights_of(adapter: LoRAAdapter) -> AdapterWeights:
    return AdapterWeights(
        rank=adapter.rank,
        alpha=float(adapter.alpha),
        target_modules=tuple(sorted(adapter.target_modules)),
        sha256=adapter.sha256,
        size_bytes=adapter.size_bytes,
        kind=adapter.kind,
    )
