"""Register, look up and retire adapters: the registry store's names joined to the engine's cache.

Registration validates and loads the weights into the CPU tier before it answers, on a
worker thread, so a bad directory is refused with 400 while the engine keeps stepping; only
then is the adapter written to the store, under an id the store handed out (every replica
builds the same LoRARequest from it). Retiring an adapter (delete, or a re-registration
under the same name, here or on another replica) removes the name at once, lets the
requests already using it finish, then drops its weights from memory.

Ownership: the operator's adapters have no tenant; a tenant registers from its own folder,
`<adapter-root>/<tenant>/`, and owns what it registers. Names are global: a name another
owner holds is a 409 that does not say who holds it.
"""

from __future__ import annotations

import logging
from pathlib import Path

from loragate.adapters import AdapterError, LoRARequest
from loragate.adapters.registry_store import (
    AdapterNameTaken,
    AdapterQuotaExceeded,
    AdapterSpec,
    RegistryStore,
    RegistryUnavailable,
    TenantNotFound,
)
from loragate.gateway.adapter_catalog import AdapterCatalog
from loragate.gateway.adapter_paths import AdapterPathError, relative_to_root, resolve_adapter_dir
from loragate.gateway.adapter_usage import AdapterUsage
from loragate.gateway.errors import (
    APIError,
    ConflictError,
    InvalidRequestError,
    NotFoundError,
    PermissionDeniedError,
    QuotaExceededError,
    RegistryDownError,
)
from loragate.gateway.registry import AdapterRecord, check_adapter_name
from loragate.gateway.store_health import StoreHealth
from loragate.gateway.tenancy import OPERATOR, Principal

log = logging.getLogger(__name__)

# Retry-After for a tenant at its max_adapters: nothing frees up by itself, so be patient.
ADAPTER_QUOTA_RETRY_AFTER_S = 60


def registry_down(action: str) -> RegistryDownError:
    return RegistryDownError(
        f"the adapter registry is unreachable, so {action} is not possible right now; "
        "adapters already registered keep being served. Retry later.",
        code="registry_unavailable",
        headers={"Retry-After": "1"},
    )


class AdapterManager:
    def __init__(
        self,
        engine,
        store: RegistryStore,
        health: StoreHealth,
        usage: AdapterUsage,
        adapter_root: Path | None,
        base_model: str,
        load_timeout: float | None = None,
    ):
        self.engine = engine
        self.load_timeout = load_timeout  # None: the engine's adapter_load_timeout
        self.store = store
        self.health = health
        self.usage = usage
        self.root = adapter_root
        self.base_model = base_model
        self.catalog = AdapterCatalog(adapter_root, self.retire)
        self.preload_waiting: set[str] = set()

    def scrub(self, text: str) -> str:
        """Error text with the server's adapter root replaced, so no absolute path leaks."""
        if self.root is None:
            return text
        return text.replace(str(self.root), "<adapter-root>")

    async def lookup(self, name: str, param: str, caller: Principal = OPERATOR) -> AdapterRecord:
        """The adapter `caller` may use; another tenant's is exactly as missing as no adapter."""
        record = await self.catalog.visible(caller, name)
        if record is None:
            raise NotFoundError(
                f"the model or adapter {name!r} does not exist", param=param, code="model_not_found"
            )
        return record

    # ---- registering -------------------------------------------------------------------
    async def register(
        self,
        name: str,
        path: str,
        source: str = "rest",
        caller: Principal = OPERATOR,
        public: bool | None = None,
    ) -> AdapterRecord:
        try:
            check_adapter_name(name, self.base_model)
        except ValueError as exc:
            raise InvalidRequestError(str(exc), param="name") from exc
        if public is not None and not caller.is_operator:
            raise PermissionDeniedError(
                "only the admin may make an adapter public", param="public", code="admin_only"
            )
        existing = await self.catalog.get(name)
        if existing is not None and existing.tenant != caller.tenant:
            raise _name_taken(name)
        if public is None:
            public = existing.public if existing is not None else False
        try:
            directory = resolve_adapter_dir(self._root_of(caller), path)
        except AdapterPathError as exc:
            raise InvalidRequestError(str(exc), param="path", code="invalid_path") from exc
        cache = self.engine.engine.adapters
        if cache is None:
            raise InvalidRequestError(
                "this server was started with LoRA disabled; adapters cannot be registered",
                param="name",
            )
        try:
            with self.health.noting():
                lora_int_id = await self.store.new_lora_int_id()
        except RegistryUnavailable as exc:
            raise registry_down("registering an adapter") from exc
        lora = LoRARequest(name, lora_int_id, str(directory))
        try:
            adapter = await self.engine.load_adapter(lora, timeout=self.load_timeout)
        except AdapterError as exc:
            raise InvalidRequestError(
                f"invalid adapter: {self.scrub(str(exc))}", param="path", code="invalid_adapter"
            ) from exc
        spec = AdapterSpec(
            name=name,
            tenant=caller.tenant,
            public=public,
            base_model=self.base_model,
            rank=adapter.rank,
            alpha=float(adapter.alpha),
            target_modules=tuple(sorted(adapter.target_modules)),
            sha256=adapter.sha256,
            size_bytes=adapter.size_bytes,
            path=relative_to_root(self.root, directory),
        )
        try:
            record = await self._store_registration(spec, lora, source)
        except Exception:
            await self._evict(lora)
            raise
        log.info("registered adapter %s (id %d, rank %d)", name, lora_int_id, adapter.rank)
        return record

    async def _store_registration(
        self, spec: AdapterSpec, lora: LoRARequest, source: str
    ) -> AdapterRecord:
        try:
            async with self.catalog.lock:
                with self.health.noting():
                    registration = await self.store.register_adapter(
                        spec, lora_int_id=lora.lora_int_id
                    )
                record = await self.catalog.apply(registration.adapter, source, lora)
        except RegistryUnavailable as exc:
            raise registry_down("registering an adapter") from exc
        except AdapterNameTaken as exc:
            raise _name_taken(spec.name) from exc
        except AdapterQuotaExceeded as exc:
            raise QuotaExceededError(
                f"this tenant already owns its maximum of {exc.limit} adapters; delete one "
                "before registering another",
                param="name",
                code="max_adapters",
                headers={"Retry-After": str(ADAPTER_QUOTA_RETRY_AFTER_S)},
            ) from exc
        except TenantNotFound as exc:
            raise PermissionDeniedError(
                "this tenant no longer exists in the registry", code="tenant_not_found"
            ) from exc
        assert record is not None, "a ready registration made here is always servable here"
        return record

    def _root_of(self, caller: Principal) -> Path | None:
        if self.root is None or caller.tenant is None:
            return self.root
        return self.root / caller.tenant

    # ---- changing and removing ---------------------------------------------------------
    async def set_public(self, name: str, public: bool) -> AdapterRecord:
        """Operator only (the route checks): let every tenant use `name`, or stop that."""
        await self.lookup(name, "name")
        try:
            async with self.catalog.lock:
                with self.health.noting():
                    meta = await self.store.update_adapter(name, public=public)
                if meta is not None:
                    record = await self.catalog.apply(meta)
                    if record is not None:
                        return record
        except RegistryUnavailable as exc:
            raise registry_down("changing an adapter") from exc
        raise NotFoundError(
            f"adapter {name!r} does not exist", param="name", code="adapter_not_found"
        )

    async def unregister(self, name: str, caller: Principal = OPERATOR) -> AdapterRecord:
        record = await self.catalog.visible(caller, name)
        if record is None:
            raise NotFoundError(
                f"adapter {name!r} does not exist", param="name", code="adapter_not_found"
            )
        if not caller.owns(record):
            raise PermissionDeniedError(
                f"adapter {name!r} is shared with you but not yours: only its owner or the "
                "admin may delete it",
                param="name",
                code="not_owner",
            )
        lora_int_id = record.lora_request.lora_int_id
        try:
            async with self.catalog.lock:
                with self.health.noting():
                    deleted = await self.store.delete_adapter(name, lora_int_id=lora_int_id)
                current = await self.catalog.get(name)
                mine = current is not None and current.lora_request.lora_int_id == lora_int_id
                removed = None
                if mine and (deleted is not None or name in self.catalog.orphans):
                    removed = await self.catalog.remove(name)
        except RegistryUnavailable as exc:
            raise registry_down("deleting an adapter") from exc
        if removed is None:  # replaced or deleted meanwhile, by another replica
            raise NotFoundError(
                f"adapter {name!r} does not exist", param="name", code="adapter_not_found"
            )
        await self.retire(removed)
        log.info("removed adapter %s", name)
        return removed

    async def drop_tenant(self, tenant: str) -> None:
        async with self.catalog.lock:
            await self.catalog.drop_owned_by(tenant)

    async def retire(self, record: AdapterRecord) -> None:
        """Once no request uses it any more, drop the adapter's weights from every tier."""
        await self.usage.wait_idle(record.lora_request)
        await self._evict(record.lora_request)

    async def _evict(self, lora: LoRARequest) -> None:
        if self.engine.is_running:
            await self.engine.call(lambda engine: _evict(engine, lora))

    # ---- start-up ----------------------------------------------------------------------
    async def preload_root(self, only: set[str] | None = None) -> list[str]:
        """Register every adapter directory directly under the root, named after its folder.

        An identical registration already in the store (same owner, path and weights, e.g.
        made by another replica) is adopted as it is, so starting a replica changes nothing.
        Folders the store could not take (it was down) wait in `preload_waiting`, to be
        registered when it is back.
        """
        if self.root is None:
            return []
        names = []
        for directory in sorted(p for p in self.root.iterdir() if p.is_dir()):
            if not (directory / "adapter_config.json").is_file():
                continue
            if only is not None and directory.name not in only:
                continue
            try:
                if not await self._adopt(directory):
                    await self.register(directory.name, str(directory), source="adapter_root")
            except RegistryDownError:
                log.warning("adapter folder %s waits for the registry store", directory.name)
                self.preload_waiting.add(directory.name)
                continue
            except APIError as exc:
                log.warning("skipping adapter folder %s: %s", directory.name, exc.message)
                continue
            self.preload_waiting.discard(directory.name)
            names.append(directory.name)
        return names

    async def _adopt(self, directory: Path) -> bool:
        known = await self.catalog.get(directory.name)
        cache = self.engine.engine.adapters
        if known is None or known.tenant is not None or cache is None:
            return False
        if known.display_path != relative_to_root(self.root, directory):
            return False
        try:
            adapter = await self.engine.load_adapter(known.lora_request, timeout=self.load_timeout)
        except AdapterError:
            return False
        if adapter.sha256 == known.sha256:
            return True
        await self._evict(known.lora_request)
        return False

    async def close(self) -> None:
        await self.catalog.close()


def _name_taken(name: str) -> ConflictError:
    return ConflictError(
        f"the adapter name {name!r} is not available; choose another name",
        param="name",
        code="name_taken",
    )


def _evict(engine, lora: LoRARequest) -> None:
    """On the engine thread: drop the adapter from every cache tier (its slot is zeroed)."""
    if engine.adapters is None:
        return
    busy = {s.lora_slot for s in engine.scheduler.running if getattr(s, "lora_slot", -1) >= 0}
    try:
        engine.adapters.remove(lora, busy)
    except ValueError as exc:  # still in a running batch: the LRU will evict it later
        log.warning("adapter %s kept in memory: %s", lora.lora_name, exc)
