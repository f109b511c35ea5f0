"""Register, look up and retire adapters: the registry store's names joined to the engine's cache.

Registration validates and loads the weights into the CPU tier before it answers, on a
worker thread, so a bad directory is refused with 400 while the engine keeps stepping; only
then is the adapter written to the store, under an id the store handed out (every replica
builds the same LoRARequest from it). Retiring an adapter (delete, or a re-registration
under the same name, here or on another replica) removes the name at once, lets the
requests already using it finish, then drops its weights from memory.

An adapter is its weights: the engine runs each request with the files' content as it was
at admission; when a registered adapter's files change in place, weights_update.py brings
its registry record up to date.

Ownership: the operator's adapters have no tenant; a tenant registers from its own folder,
`<adapter-root>/<tenant>/`, and owns what it registers. Each owner has its own namespace:
a tenant's `sql` and another's are two adapters, so registering a name never tells a
tenant anything about anyone else's. The operator names (and may register) a tenant's
adapter as `<tenant>/<name>`.
"""

from __future__ import annotations

import logging
from pathlib import Path

import msgspec

from loragate.adapters import AdapterError, LoRARequest
from loragate.adapters.store import AdapterStoreError
from loragate.engine import EngineDeadError, store_path
from loragate.gateway.adapter_control.adapter_store_objects import AdapterObjects, store_error
from loragate.gateway.adapter_control.catalog import AdapterCatalog
from loragate.gateway.adapter_control.paths import (
    AdapterPathError,
    hide_root,
    relative_to_root,
    resolve_adapter_dir,
)
from loragate.gateway.adapter_control.served_adapters import AdapterRecord
from loragate.gateway.adapter_control.weights_update import WeightsUpdates
from loragate.gateway.errors import (
    APIError,
    ConflictError,
    InvalidRequestError,
    NotFoundError,
    PermissionDeniedError,
    QuotaExceededError,
    RegistryDownError,
)
from loragate.gateway.registry_seam import RegistrySeam
from loragate.gateway.tenancy.principal import OPERATOR, Principal
from loragate.registry import (
    AdapterBytesQuotaExceeded,
    AdapterQuotaExceeded,
    AdapterSpec,
    PublicNameTaken,
    TenantNotFound,
    adapter_key,
    check_served_name,
    check_tenant_name,
)

log = logging.getLogger(__name__)

# Retry-After for a tenant at its max_adapters: nothing frees up by itself, so be patient.
ADAPTER_QUOTA_RETRY_AFTER_S = 60


class AdapterManager:
    def __init__(
        self,
        engine,
        store: RegistrySeam,
        adapter_root: Path | None,
        base_model: str,
        load_timeout: float | None = None,
        objects: AdapterObjects | None = None,
    ):
        self.engine = engine
        self.objects = objects  # the adapter store's objects (None: no store)
        self.load_timeout = load_timeout  # None: the engine's adapter_load_timeout
        self.store = store
        self.root = adapter_root
        self.base_model = base_model
        self.catalog = AdapterCatalog(adapter_root, self.retire, store)
        self.preload_waiting: set[str] = set()
        self.weights_updates = WeightsUpdates(self.catalog, store, engine, load_timeout, objects)

    def scrub(self, text: str) -> str:
        """Error text with the server's adapter root replaced, so no absolute path leaks."""
        return hide_root(text, self.root)

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
        anywhere: bool = False,
        replace: bool = False,
    ) -> AdapterRecord:
        """Register `name` in the caller's namespace (the operator may name `<tenant>/<name>`:
        that tenant then owns it, from that tenant's folder). `anywhere`: the operator's own
        command line (--lora-modules) names the directory, which need not be under the root.
        A name already registered is a 400 unless `replace` (vLLM's behaviour)."""
        owner, name, public = await self.prepare(name, caller, public, replace)
        try:
            if anywhere and caller.is_operator:
                directory = Path(path).expanduser().resolve()
                if not directory.is_dir():
                    raise AdapterPathError(f"{path} is not a directory")
            else:
                directory = resolve_adapter_dir(self.root_of(owner), path)
        except AdapterPathError as exc:
            raise InvalidRequestError(str(exc), param="path", code="invalid_path") from exc
        shown = relative_to_root(self.root, directory)
        return await self._register_at(
            owner, name, public, str(directory), shown, source, folder=directory
        )

    async def register_object(
        self,
        name: str,
        oid: str,
        shown_path: str,
        source: str,
        caller: Principal = OPERATOR,
        public: bool | None = None,
        replace: bool = False,
    ) -> AdapterRecord:
        """Register `name` for the adapter store's object `oid` (already written there, and
        pinned by the caller): every replica fetches the files by hash."""
        owner, name, public = await self.prepare(name, caller, public, replace)
        return await self._register_at(
            owner, name, public, store_path(oid), shown_path, source, store_object=oid
        )

    async def prepare(
        self, name: str, caller: Principal, public: bool | None, replace: bool
    ) -> tuple[str | None, str, bool]:
        """The checks before any work: whose namespace, the name free (unless `replace`),
        sharing allowed; the owner, the bare name and whether it will be public."""
        owner, name = self._owner_and_name(name, caller)
        if public is not None and not caller.is_operator:
            raise PermissionDeniedError(
                "only the admin may make an adapter public", param="public", code="admin_only"
            )
        if owner is not None and caller.is_operator:
            await self._check_tenant_exists(owner)
        existing = await self.catalog.lookup(adapter_key(owner, name))
        if existing is not None and not replace:
            raise InvalidRequestError(
                f'adapter {name!r} is already registered; send "replace": true to replace it',
                param="name",
                code="adapter_exists",
            )
        if public is None:
            public = existing.public if existing is not None else False
        if not self.engine.model_info.lora_enabled:
            raise InvalidRequestError(
                "this server was started with LoRA disabled; adapters cannot be registered",
                param="name",
            )
        return owner, name, public

    async def _register_at(
        self,
        owner: str | None,
        name: str,
        public: bool,
        lora_path: str,
        shown_path: str,
        source: str,
        store_object: str | None = None,
        folder: Path | None = None,
    ) -> AdapterRecord:
        """Load `lora_path` (validating it), then record the registration. A `folder` from
        the adapter root is also kept in the store when the deployment has one."""
        key = adapter_key(owner, name)
        lora_int_id = await self.store.new_lora_int_id()
        lora = LoRARequest(key, lora_int_id, lora_path)
        try:
            adapter = await self.engine.add_adapter(lora, timeout=self.load_timeout)
        except AdapterError as exc:
            raise InvalidRequestError(
                f"invalid adapter: {self.scrub(str(exc))}", param="path", code="invalid_adapter"
            ) from exc
        except AdapterStoreError as exc:
            raise store_error(exc) from exc
        spec = AdapterSpec(
            name=name,
            tenant=owner,
            public=public,
            base_model=self.base_model,
            rank=adapter.rank,
            alpha=float(adapter.alpha),
            target_modules=tuple(sorted(adapter.target_modules)),
            sha256=adapter.sha256,
            size_bytes=adapter.size_bytes,
            path=shown_path,
            store_object=store_object,
            kind=adapter.kind,
        )
        try:
            if folder is None or self.objects is None:
                record = await self._store_registration(spec, lora, source)
            else:
                async with self.objects.imported(folder, adapter.sha256) as oid:
                    spec = msgspec.structs.replace(spec, store_object=oid)
                    record = await self._store_registration(spec, lora, source)
        except Exception:
            await self._evict(lora)
            raise
        log.info("registered adapter %s (id %d, rank %d)", key, lora_int_id, adapter.rank)
        return record

    async def _check_tenant_exists(self, tenant: str) -> None:
        """The operator named `<tenant>/<name>`: 400 before any work if there is no tenant."""
        record = await self.store.get_tenant(tenant)
        if record is None:
            raise InvalidRequestError(
                f"tenant {tenant!r} does not exist, so it has no adapter namespace",
                param="name",
                code="tenant_not_found",
            )

    def _owner_and_name(self, name: object, caller: Principal) -> tuple[str | None, str]:
        """Whose namespace `name` is in, and the name there; 400 for a name none can have.

        A tenant's names never hold a '/' (the refusal is the same whatever the prefix, so
        it says nothing of other tenants)."""
        owner, bare = caller.tenant, name
        if isinstance(name, str) and "/" in name and caller.is_operator:
            owner, _, bare = name.partition("/")
            try:
                check_tenant_name(owner)
            except ValueError as exc:
                raise InvalidRequestError(str(exc), param="name") from exc
        try:
            check_served_name(bare, self.base_model)
        except ValueError as exc:
            raise InvalidRequestError(str(exc), param="name") from exc
        return owner, bare

    async def _store_registration(
        self, spec: AdapterSpec, lora: LoRARequest, source: str
    ) -> AdapterRecord:
        try:
            async with self.catalog.lock:
                registration = await self.store.register_adapter(spec, lora_int_id=lora.lora_int_id)
                record = await self.catalog.apply(registration.adapter, source, lora)
        except PublicNameTaken as exc:
            raise _public_name_taken(exc) from exc
        except AdapterQuotaExceeded as exc:
            raise QuotaExceededError(
                f"this tenant already owns its maximum of {exc.limit} adapters; delete one "
                "before registering another",
                param="name",
                code="max_adapters",
                headers={"Retry-After": str(ADAPTER_QUOTA_RETRY_AFTER_S)},
            ) from exc
        except AdapterBytesQuotaExceeded as exc:
            raise QuotaExceededError(
                f"this tenant's adapters hold {exc.used} bytes; {exc.wanted} more would pass "
                f"its max_adapter_bytes of {exc.limit}: delete an adapter first",
                param="adapter_model.safetensors",
                code="max_adapter_bytes",
                headers={"Retry-After": str(ADAPTER_QUOTA_RETRY_AFTER_S)},
            ) from exc
        except TenantNotFound as exc:
            raise PermissionDeniedError(
                f"tenant {exc.name!r} does not exist in the registry", code="tenant_not_found"
            ) from exc
        assert record is not None, "a ready registration made here is always servable here"
        return record

    def root_of(self, owner: str | None) -> Path | None:
        if self.root is None or owner is None:
            return self.root
        return self.root / owner

    # ---- changing and removing ---------------------------------------------------------
    async def set_public(self, name: str, public: bool) -> AdapterRecord:
        """Operator only (the route checks): let every tenant use `name`, or stop that.
        Public names are unique: 409 if another public adapter has this one's name."""
        key = (await self.lookup(name, "name")).key
        try:
            async with self.catalog.lock:
                meta = await self.store.update_adapter(key, public=public)
                if meta is not None:
                    record = await self.catalog.apply(meta)
                    if record is not None:
                        return record
        except PublicNameTaken as exc:
            raise _public_name_taken(exc) from exc
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
        key, lora_int_id = record.key, record.lora_request.lora_int_id
        async with self.catalog.lock:
            deleted = await self.store.delete_adapter(key, lora_int_id=lora_int_id)
            current = await self.catalog.get(key)
            mine = current is not None and current.lora_request.lora_int_id == lora_int_id
            removed = None
            if mine and (deleted is not None or key in self.catalog.orphans):
                removed = await self.catalog.remove(key)
        if removed is None:  # replaced or deleted meanwhile, by another replica
            raise NotFoundError(
                f"adapter {name!r} does not exist", param="name", code="adapter_not_found"
            )
        await self.retire(removed)
        log.info("removed adapter %s", key)
        return removed

    async def drop_tenant(self, tenant: str) -> None:
        async with self.catalog.lock:
            await self.catalog.drop_owned_by(tenant)

    async def retire(self, record: AdapterRecord) -> None:
        """Once no request uses it any more, drop the adapter's weights from every tier."""
        await self.engine.wait_adapter_idle(record.lora_request)
        await self._evict(record.lora_request)
        if self.objects is not None:
            await self.objects.collect(record.store_object)

    async def _evict(self, lora: LoRARequest) -> None:
        """Drop the adapter from every cache tier (its slot is zeroed)."""
        try:
            await self.engine.remove_adapter(lora)
        except ValueError as exc:  # still in a running batch: the LRU will evict it later
            log.warning("adapter %s kept in memory: %s", lora.lora_name, exc)
        except EngineDeadError:
            pass  # nothing is served any more, so nothing to evict

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
                    await self.register(
                        directory.name, str(directory), source="adapter_root", replace=True
                    )
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
        known = await self.catalog.lookup(directory.name)
        lora_enabled = self.engine.model_info.lora_enabled
        if known is None or known.tenant is not None or not lora_enabled:
            return False
        if known.display_path != relative_to_root(self.root, directory):
            return False
        try:
            adapter = await self.engine.add_adapter(known.lora_request, timeout=self.load_timeout)
        except AdapterError:
            return False
        if adapter.sha256 == known.sha256:
            return True
        await self._evict(known.lora_request)
        return False

    def start(self) -> None:
        """Background work of a started server: the adapter store's sweep, and the
        registry following weights that change behind a name."""
        self.weights_updates.start()
        if self.objects is not None:
            self.objects.start()

    async def close(self) -> None:
        self.weights_updates.stop()
        if self.objects is not None:
            await self.objects.stop()
        await self.catalog.close()


def _public_name_taken(exc: PublicNameTaken) -> ConflictError:
    """Only the admin makes adapters public, so naming the holder tells a tenant nothing."""
    return ConflictError(
        f"another public adapter ({exc.holder!r}) is already called {exc.name!r}: every "
        "tenant names public adapters by their bare name, so those names must be unique",
        param="name",
        code="public_name_taken",
    )
