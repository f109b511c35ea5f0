"""The registry store for one process: dicts, and events delivered to in-process watchers.

No method awaits between reading and writing its state, so each one is atomic among the
coroutines of its event loop without a lock.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import msgspec

from loragate.registry.adapter_index import (
    DEFAULT_CHANGE_LOG_SIZE,
    DEFAULT_PAGE_SIZE,
    AdapterCounts,
    AdapterPage,
    ChangeLog,
    MemoryAdapterIndex,
    check_page,
)
from loragate.registry.adapter_objects import MemoryObjects, check_adapter_room
from loragate.registry.api_keys import StoredKey, issue_api_key, parse_api_key, secret_matches
from loragate.registry.errors import (
    AdapterNameTaken,
    PublicNameTaken,
    RegistryChanged,
    StaleAdapterId,
    TenantExists,
    TenantNotFound,
)
from loragate.registry.memory_quotas import MemoryQuotas, TenantLoad
from loragate.registry.names import (
    adapter_key,
    check_adapter_key,
    check_adapter_name,
    check_tenant_name,
)
from loragate.registry.persistence import Persistence, in_memory
from loragate.registry.records import (
    RESTORED_NAME,
    AdapterMetadata,
    AdapterSpec,
    AdapterWeights,
    ChangeEvent,
    ChangeKind,
    IssuedKey,
    Registration,
    TenantQuota,
    TenantRecord,
    UsageCounts,
    UsageReport,
    adapter_changes,
    check_count,
    check_lease_ttl,
    check_quota,
    check_usage,
    check_weight,
)
from loragate.registry.snapshot import RegistrySnapshot
from loragate.registry.store import RegistryStore


class MemoryRegistryStore(MemoryObjects, MemoryQuotas, RegistryStore):
    """The default store: everything lives and dies with this process."""

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.time,
        lease_ttl_s: float = 300.0,
        change_log_size: int = DEFAULT_CHANGE_LOG_SIZE,
    ):
        self._clock = clock
        self._lease_ttl = check_lease_ttl(lease_ttl_s)
        self._index = MemoryAdapterIndex(check_count("change_log_size", change_log_size, 1))
        self._last_lora_int_id = 0
        self._tenants: dict[str, TenantRecord] = {}
        self._keys: dict[str, StoredKey] = {}
        self._usage: dict[str, dict[str | None, UsageCounts]] = {}
        self._load: dict[str, TenantLoad] = {}
        self._watchers: set[asyncio.Queue[ChangeEvent]] = set()
        self._version = 0
        self._opened = False
        self._pins: dict[str, dict[str, float]] = {}  # adapter store objects (MemoryObjects)
        self._claims: dict[str, float] = {}
        self._epoch = uuid.uuid4().hex

    def _changed(self, kind: ChangeKind, name: str) -> None:
        self._version += 1
        self._index.log(self._version, kind, name)
        event = ChangeEvent(kind, name)
        for queue in self._watchers:
            queue.put_nowait(event)

    # lifecycle

    async def open(self) -> bool:
        was_opened, self._opened = self._opened, True
        return not was_opened

    async def check_reset(self) -> bool:
        return False

    async def ping(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def persistence(self) -> Persistence:
        return in_memory()

    # backups

    async def snapshot(self) -> RegistrySnapshot:
        return RegistrySnapshot(
            tenants=tuple(await self.list_tenants()),
            keys=tuple(self._keys[k] for k in sorted(self._keys)),
            adapters=tuple(await self.list_adapters()),
            usage=tuple(await self.list_usage()),
            last_lora_int_id=self._last_lora_int_id,
            epoch=self._epoch,
            version=self._version,
        )

    async def restore(self, snapshot: RegistrySnapshot, *, expect_version: int | None) -> None:
        if expect_version is not None and expect_version != self._version:
            raise RegistryChanged(
                f"the registry changed while the import was planned (version {expect_version} "
                f"-> {self._version}); run it again"
            )
        for tenant in snapshot.tenants:
            self._tenants[tenant.name] = tenant
        for stored in snapshot.keys:
            self._keys[stored.key_id] = stored
        for adapter in snapshot.adapters:
            self._index.put(adapter)
        for report in snapshot.usage:
            counters = self._usage.setdefault(report.tenant, {})
            for key, add in ((None, report.total), *report.by_adapter.items()):
                counters[key] = _plus(counters.get(key, UsageCounts()), add)
        self._last_lora_int_id = max(self._last_lora_int_id, snapshot.highest_lora_int_id)
        self._changed(ChangeKind.REGISTRY_RESTORED, RESTORED_NAME)

    # adapters

    def _next_lora_int_id(self) -> int:
        self._last_lora_int_id += 1
        return self._last_lora_int_id

    async def new_lora_int_id(self) -> int:
        return self._next_lora_int_id()

    async def register_adapter(
        self, spec: AdapterSpec, *, lora_int_id: int | None = None, replace: bool = True
    ) -> Registration:
        if not isinstance(spec, AdapterSpec) or isinstance(spec, AdapterMetadata):
            raise ValueError(f"spec must be an AdapterSpec, got {type(spec).__name__}")
        key = adapter_key(spec.tenant, spec.name)
        old = self._index.get(key)
        if old is not None and not replace:
            raise AdapterNameTaken(key)
        if spec.public:
            self._check_public_name(key, spec.name)
        if lora_int_id is not None:
            check_count("lora_int_id", lora_int_id, minimum=1)
            if lora_int_id > self._last_lora_int_id or (old and old.lora_int_id == lora_int_id):
                raise StaleAdapterId(
                    f"lora_int_id {lora_int_id} was not handed out by new_lora_int_id "
                    "or belongs to the registration being replaced"
                )
        if spec.tenant is not None:
            tenant = self._tenants.get(spec.tenant)
            if tenant is None:
                raise TenantNotFound(spec.tenant)
            check_adapter_room(tenant, self._index.counts(spec.tenant), old, spec)
        if lora_int_id is None:
            lora_int_id = self._next_lora_int_id()
        adapter = AdapterMetadata(
            **msgspec.structs.asdict(spec), lora_int_id=lora_int_id, created_at=self._clock()
        )
        self._index.put(adapter)
        self._changed(ChangeKind.ADAPTER_REGISTERED, key)
        return Registration(adapter, old)

    def _check_public_name(self, key: str, name: str) -> None:
        other = self._index.public_key(name)
        if other is not None and other != key:
            raise PublicNameTaken(name, other)

    async def get_adapter(self, key: str) -> AdapterMetadata | None:
        return self._index.get(check_adapter_key(key))

    async def get_adapters(self, keys: list[str]) -> list[AdapterMetadata | None]:
        return [self._index.get(check_adapter_key(key)) for key in keys]

    async def list_adapters(self) -> list[AdapterMetadata]:
        return list(self._index.every())

    async def public_adapter(self, name: str) -> AdapterMetadata | None:
        key = self._index.public_key(check_adapter_name(name))
        return None if key is None else self._index.get(key)

    async def adapter_counts(self, tenant: str) -> AdapterCounts:
        return self._index.counts(check_tenant_name(tenant))

    async def page_adapters(
        self, *, after: str | None = None, limit: int = DEFAULT_PAGE_SIZE
    ) -> AdapterPage:
        return self._index.page(*check_page(after, limit))

    async def page_visible_adapters(
        self, tenant: str, *, after: str | None = None, limit: int = DEFAULT_PAGE_SIZE
    ) -> AdapterPage:
        return self._index.visible_page(check_tenant_name(tenant), *check_page(after, limit))

    async def update_adapter(
        self,
        key: str,
        *,
        status: str | None = None,
        public: bool | None = None,
        lora_int_id: int | None = None,
        weights: AdapterWeights | None = None,
    ) -> AdapterMetadata | None:
        old = self._index.get(check_adapter_key(key))
        if old is None or (lora_int_id is not None and old.lora_int_id != lora_int_id):
            return None
        if public:
            self._check_public_name(key, old.name)
        changes = adapter_changes(status, public, weights)
        new = msgspec.structs.replace(old, **changes)
        self._index.put(new)
        self._changed(ChangeKind.ADAPTER_UPDATED, key)
        return new

    async def delete_adapter(
        self, key: str, *, lora_int_id: int | None = None
    ) -> AdapterMetadata | None:
        old = self._index.get(check_adapter_key(key))
        if old is None or (lora_int_id is not None and old.lora_int_id != lora_int_id):
            return None
        self._index.remove(key)
        self._changed(ChangeKind.ADAPTER_DELETED, key)
        return old

    # tenants

    async def create_tenant(
        self, name: str, quota: TenantQuota | None = None, weight: float = 1.0
    ) -> IssuedKey:
        check_tenant_name(name)
        quota = check_quota(quota if quota is not None else TenantQuota())
        weight = check_weight(weight)
        if name in self._tenants:
            raise TenantExists(name)
        api_key, stored = issue_api_key(name)
        tenant = TenantRecord(
            name=name,
            quota=quota,
            created_at=self._clock(),
            key_ids=(stored.key_id,),
            weight=weight,
        )
        self._tenants[name] = tenant
        self._keys[stored.key_id] = stored
        self._changed(ChangeKind.TENANT_CREATED, name)
        return IssuedKey(tenant, api_key)

    async def get_tenant(self, name: str) -> TenantRecord | None:
        return self._tenants.get(check_tenant_name(name))

    async def list_tenants(self) -> list[TenantRecord]:
        return sorted(self._tenants.values(), key=lambda t: t.name)

    def _existing_tenant(self, name: str) -> TenantRecord:
        tenant = self._tenants.get(check_tenant_name(name))
        if tenant is None:
            raise TenantNotFound(name)
        return tenant

    async def set_tenant_quota(self, name: str, quota: TenantQuota) -> TenantRecord:
        check_quota(quota)
        tenant = msgspec.structs.replace(self._existing_tenant(name), quota=quota)
        self._tenants[name] = tenant
        self._changed(ChangeKind.TENANT_UPDATED, name)
        return tenant

    async def set_tenant_weight(self, name: str, weight: float) -> TenantRecord:
        weight = check_weight(weight)
        tenant = msgspec.structs.replace(self._existing_tenant(name), weight=weight)
        self._tenants[name] = tenant
        self._changed(ChangeKind.TENANT_UPDATED, name)
        return tenant

    async def rotate_tenant_key(self, name: str) -> IssuedKey:
        old = self._existing_tenant(name)
        api_key, stored = issue_api_key(name)
        for key_id in old.key_ids:
            self._keys.pop(key_id, None)
        self._keys[stored.key_id] = stored
        tenant = msgspec.structs.replace(old, key_ids=(stored.key_id,))
        self._tenants[name] = tenant
        self._changed(ChangeKind.TENANT_UPDATED, name)
        return IssuedKey(tenant, api_key)

    async def delete_tenant(self, name: str) -> TenantRecord | None:
        tenant = self._tenants.pop(check_tenant_name(name), None)
        if tenant is None:
            return None
        for key_id in tenant.key_ids:
            self._keys.pop(key_id, None)
        owned = [adapter_key(name, a) for a in self._index.owned_names(name)]
        for adapter in owned:
            self._index.remove(adapter)
            self._changed(ChangeKind.ADAPTER_DELETED, adapter)
        self._changed(ChangeKind.TENANT_DELETED, name)
        return tenant

    async def verify_api_key(self, api_key: str) -> str | None:
        parsed = parse_api_key(api_key)
        if parsed is None:
            return None
        key_id, secret = parsed
        stored = self._keys.get(key_id)
        return stored.tenant if secret_matches(stored, secret) else None

    # usage

    async def record_usage(
        self,
        tenant: str,
        adapter: str | None,
        *,
        prompt_tokens: int,
        completion_tokens: int,
        requests: int = 1,
    ) -> None:
        add = check_usage(tenant, adapter, prompt_tokens, completion_tokens, requests)
        counters = self._usage.setdefault(tenant, {})
        for key in (None, adapter) if adapter is not None else (None,):
            counters[key] = _plus(counters.get(key, UsageCounts()), add)

    async def get_usage(self, tenant: str) -> UsageReport:
        counters = self._usage.get(check_tenant_name(tenant), {})
        by_adapter = {name: c for name, c in sorted(counters.items(), key=_by_name) if name}
        return UsageReport(tenant, counters.get(None, UsageCounts()), by_adapter)

    async def list_usage(self) -> list[UsageReport]:
        return [await self.get_usage(tenant) for tenant in sorted(self._usage)]

    # changes

    @asynccontextmanager
    async def watch(self) -> AsyncIterator[AsyncIterator[ChangeEvent]]:
        queue: asyncio.Queue[ChangeEvent] = asyncio.Queue()
        self._watchers.add(queue)
        try:
            yield _EventFeed(queue)
        finally:
            self._watchers.discard(queue)

    async def version(self) -> int:
        return self._version

    async def changes_since(self, version: int, *, limit: int = 1000) -> ChangeLog:
        check_count("version", version)
        return self._index.changes_since(version, self._version, check_count("limit", limit, 1))


class _EventFeed:
    """The change events one watcher has not read yet, as an async iterator."""

    def __init__(self, queue: asyncio.Queue[ChangeEvent]):
        self._queue = queue

    def __aiter__(self) -> _EventFeed:
        return self

    async def __anext__(self) -> ChangeEvent:
        return await self._queue.get()


def _plus(a: UsageCounts, b: UsageCounts) -> UsageCounts:
    return UsageCounts(
        a.prompt_tokens + b.prompt_tokens,
        a.completion_tokens + b.completion_tokens,
        a.requests + b.requests,
    )


def _by_name(item: tuple[str | None, UsageCounts]) -> str:
    return item[0] or ""
