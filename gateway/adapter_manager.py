"""Register, look up and retire adapters: the registry's names joined to the engine's cache.

Registration validates and loads the weights into the CPU tier before it answers, on a
worker thread, so a bad directory is refused with 400 while the engine keeps stepping.
Retiring an adapter (delete, or a re-registration under the same name) removes the name
at once, lets the requests already using it finish, then drops its weights from memory.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

from loragate.adapters import AdapterError, LoRARequest
from loragate.gateway.adapter_paths import AdapterPathError, relative_to_root, resolve_adapter_dir
from loragate.gateway.adapter_usage import AdapterUsage
from loragate.gateway.errors import InvalidRequestError, NotFoundError
from loragate.gateway.registry import AdapterRecord, AdapterRegistry, check_adapter_name

log = logging.getLogger(__name__)


class AdapterManager:
    def __init__(
        self,
        engine,
        registry: AdapterRegistry,
        usage: AdapterUsage,
        adapter_root: Path | None,
        base_model: str,
    ):
        self.engine = engine
        self.registry = registry
        self.usage = usage
        self.root = adapter_root
        self.base_model = base_model
        self._retiring: set[asyncio.Task] = set()

    def scrub(self, text: str) -> str:
        """Error text with the server's adapter root replaced, so no absolute path leaks."""
        if self.root is None:
            return text
        return text.replace(str(self.root), "<adapter-root>")

    async def lookup(self, name: str, param: str) -> AdapterRecord:
        record = await self.registry.get(name)
        if record is None:
            raise NotFoundError(
                f"the model or adapter {name!r} does not exist", param=param, code="model_not_found"
            )
        return record

    async def register(self, name: str, path: str, source: str = "rest") -> AdapterRecord:
        try:
            check_adapter_name(name, self.base_model)
        except ValueError as exc:
            raise InvalidRequestError(str(exc), param="name") from exc
        try:
            directory = resolve_adapter_dir(self.root, path)
        except AdapterPathError as exc:
            raise InvalidRequestError(str(exc), param="path", code="invalid_path") from exc
        cache = self.engine.engine.adapters
        if cache is None:
            raise InvalidRequestError(
                "this server was started with LoRA disabled; adapters cannot be registered",
                param="name",
            )
        lora = LoRARequest(name, await self.registry.new_id(), str(directory))
        try:
            adapter = await asyncio.to_thread(cache.preload, lora)
        except AdapterError as exc:
            raise InvalidRequestError(
                f"invalid adapter: {self.scrub(str(exc))}", param="path", code="invalid_adapter"
            ) from exc
        record = AdapterRecord(
            name=name,
            lora_request=lora,
            display_path=relative_to_root(self.root, directory),
            rank=adapter.rank,
            alpha=float(adapter.alpha),
            target_modules=tuple(sorted(adapter.target_modules)),
            sha256=adapter.sha256,
            size_bytes=adapter.size_bytes,
            created=int(time.time()),
            source=source,
        )
        previous = await self.registry.put(record)
        if previous is not None:
            task = asyncio.create_task(self._retire(previous))
            self._retiring.add(task)
            task.add_done_callback(self._retiring.discard)
        log.info("registered adapter %s (id %d, rank %d)", name, lora.lora_int_id, adapter.rank)
        return record

    async def unregister(self, name: str) -> AdapterRecord:
        record = await self.registry.remove(name)
        if record is None:
            raise NotFoundError(
                f"adapter {name!r} does not exist", param="name", code="adapter_not_found"
            )
        await self._retire(record)
        log.info("removed adapter %s", name)
        return record

    async def _retire(self, record: AdapterRecord) -> None:
        lora = record.lora_request
        await self.usage.wait_idle(lora)
        if self.engine.is_running:
            await self.engine.call(lambda engine: _evict(engine, lora))

    async def preload_root(self) -> list[str]:
        """Register every adapter directory directly under the root, named after its folder."""
        if self.root is None:
            return []
        names = []
        for directory in sorted(p for p in self.root.iterdir() if p.is_dir()):
            if not (directory / "adapter_config.json").is_file():
                continue
            try:
                await self.register(directory.name, str(directory), source="adapter_root")
            except (InvalidRequestError, NotFoundError) as exc:
                log.warning("skipping adapter folder %s: %s", directory.name, exc.message)
                continue
            names.append(directory.name)
        return names

    async def close(self) -> None:
        for task in list(self._retiring):
            task.cancel()


def _evict(engine, lora: LoRARequest) -> None:
    """On the engine thread: drop the adapter from every cache tier (its slot is zeroed)."""
    if engine.adapters is None:
        return
    busy = {s.lora_slot for s in engine.scheduler.running if getattr(s, "lora_slot", -1) >= 0}
    try:
        engine.adapters.remove(lora, busy)
    except ValueError as exc:  # still in a running batch: the LRU will evict it later
        log.warning("adapter %s kept in memory: %s", lora.lora_name, exc)
