"""The registry store: adapters, tenants, usage and quotas that every gateway replica shares.

`RegistryStore` is the one interface; `MemoryRegistryStore` (one process, the default) and
`RedisRegistryStore` (many replicas on one Redis) implement it and pass one contract suite.
The store holds plain data only (msgspec Structs): the gateway decides what to serve from it.

Why the shapes below:
- Each owner names its adapters in its own namespace: an adapter is stored under its key,
  `<tenant>/<name>` for a tenant's and the bare `<name>` for the operator's, so two tenants'
  `sql` are two adapters and no answer about one tenant's names depends on another's. The
  public names (what every tenant may use) are unique among public adapters
  (`PublicNameTaken`). Every registration gets a new, never reused lora_int_id, so no
  engine cache can hand back the weights of an older registration.
- Quotas reserve a request's worst case (tokens, and the sequences it counts as) when it is
  admitted and settle what it used when it ends, so a burst cannot overrun a quota.
- API keys are `lg-<key_id>-<secret>`; the store keeps only a salted hash per key_id
  (see `loragate.registry.api_keys`), so verification is one lookup and one
  constant-time comparison.
- A store that cannot reach its backend raises `RegistryUnavailable` from every method;
  whether to serve from a local cache then is the caller's choice.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager

from loragate.registry.adapter_index import (
    DEFAULT_PAGE_SIZE,
    AdapterCounts,
    AdapterPage,
    ChangeLog,
)
from loragate.registry.persistence import Persistence
from loragate.registry.records import (
    AdapterMetadata,
    AdapterSpec,
    AdapterWeights,
    Admission,
    ChangeEvent,
    IssuedKey,
    Registration,
    TenantQuota,
    TenantRecord,
    UsageCounts,
    UsageReport,
    check_usage,
)
from loragate.registry.snapshot import RegistrySnapshot


class RegistryStore(ABC):
    """Adapters, tenants, usage counters and quota windows, shared by gateway replicas.

    Every method is a coroutine and may raise RegistryUnavailable. Writes that change
    adapters or tenants bump `version()` and are announced to every `watch()`er.
    """

    # lifecycle

    @abstractmethod
    async def open(self) -> bool:
        """Connect and mark the store; True when it held no data (first start, or wiped)."""

    @abstractmethod
    async def check_reset(self) -> bool:
        """True once after the store lost its data since open() or the last check."""

    @abstractmethod
    async def ping(self) -> None:
        """Return if the backend answers; raise RegistryUnavailable otherwise."""

    @abstractmethod
    async def close(self) -> None: ...

    @abstractmethod
    async def persistence(self) -> Persistence:
        """Whether the backend keeps the registry over its own restart, as it says itself."""

    # backups (see loragate.registry.backup)

    @abstractmethod
    async def snapshot(self) -> RegistrySnapshot:
        """Tenants with their keys' digests, adapters, usage counts and the lora_int_id
        counter, read together (one transaction on Redis), with the store's version."""

    @abstractmethod
    async def restore(self, snapshot: RegistrySnapshot, *, expect_version: int | None) -> None:
        """Write the snapshot's records as they are (tenants and keys, adapters with their
        lora_int_ids), add its usage counts to the store's, raise the lora_int_id counter to
        at least its own, and announce it once (ChangeKind.REGISTRY_RESTORED: a watcher
        re-reads what it holds), all visible in one atomic step: a reader sees the store as
        it was or with the whole snapshot, never part of it (Redis writes it in batches
        where no reader looks, then switches it in: redis_restore). With `expect_version`,
        RegistryChanged (writing nothing) if the store's version moved since: the caller
        decided what to write from an older read; adapters and tenants changed while it
        is written also make it RegistryChanged. Conflicts are the caller's to rule out
        (backup.import_backup does)."""

    # adapters

    @abstractmethod
    async def new_lora_int_id(self) -> int:
        """An id never handed out before, to preload weights under before registering."""

    @abstractmethod
    async def register_adapter(
        self, spec: AdapterSpec, *, lora_int_id: int | None = None, replace: bool = True
    ) -> Registration:
        """Store `spec` under its key (the owner's namespace) with a new lora_int_id (or
        the one given); another owner's adapter of the same name is a different adapter.

        An existing key with replace=False raises AdapterNameTaken; a public adapter whose
        name another public adapter has, PublicNameTaken. A tenant-owned adapter needs the
        tenant to exist (TenantNotFound) and, if new, to be within its max_adapters
        (AdapterQuotaExceeded).
        """

    @abstractmethod
    async def get_adapter(self, key: str) -> AdapterMetadata | None:
        """The adapter stored under `key` (see adapter_key)."""

    @abstractmethod
    async def get_adapters(self, keys: list[str]) -> list[AdapterMetadata | None]:
        """The adapters stored under `keys`, in their order (None where absent), read in
        one step (one HMGET on Redis): how a replica re-reads what it holds."""

    @abstractmethod
    async def list_adapters(self) -> list[AdapterMetadata]:
        """Every adapter, sorted by key: reads every record (backups, small registries);
        lists served to clients use the pages below."""

    @abstractmethod
    async def public_adapter(self, name: str) -> AdapterMetadata | None:
        """The public adapter every tenant may call `name`, if any: one lookup."""

    @abstractmethod
    async def adapter_counts(self, tenant: str) -> AdapterCounts:
        """How many adapters the tenant owns and their bytes: counters, never a scan."""

    @abstractmethod
    async def page_adapters(
        self, *, after: str | None = None, limit: int = DEFAULT_PAGE_SIZE
    ) -> AdapterPage:
        """Up to `limit` adapters with keys after `after`, in key order (one round trip)."""

    @abstractmethod
    async def page_visible_adapters(
        self, tenant: str, *, after: str | None = None, limit: int = DEFAULT_PAGE_SIZE
    ) -> AdapterPage:
        """Up to `limit` adapters `tenant` may name, with names after `after`, in name
        order: its own, and the public ones its own names do not hide (one round trip)."""

    @abstractmethod
    async def update_adapter(
        self,
        key: str,
        *,
        status: str | None = None,
        public: bool | None = None,
        lora_int_id: int | None = None,
        weights: AdapterWeights | None = None,
    ) -> AdapterMetadata | None:
        """Change status, public and/or the weights' description; None when absent (or not
        that lora_int_id). Bad weights fields raise ValueError, changing nothing; making it
        public when another public adapter has its name raises PublicNameTaken."""

    @abstractmethod
    async def delete_adapter(
        self, key: str, *, lora_int_id: int | None = None
    ) -> AdapterMetadata | None:
        """Forget `key` (only if it is still lora_int_id, when given); returns what it was."""

    # tenants

    @abstractmethod
    async def create_tenant(
        self, name: str, quota: TenantQuota | None = None, weight: float = 1.0
    ) -> IssuedKey:
        """A new tenant with one API key, returned in clear this once. TenantExists if taken."""

    @abstractmethod
    async def get_tenant(self, name: str) -> TenantRecord | None: ...

    @abstractmethod
    async def list_tenants(self) -> list[TenantRecord]:
        """Every tenant, sorted by name."""

    @abstractmethod
    async def set_tenant_quota(self, name: str, quota: TenantQuota) -> TenantRecord:
        """Replace the tenant's quota; TenantNotFound if absent."""

    @abstractmethod
    async def set_tenant_weight(self, name: str, weight: float) -> TenantRecord:
        """Replace the tenant's fair-share weight; TenantNotFound if absent."""

    @abstractmethod
    async def rotate_tenant_key(self, name: str) -> IssuedKey:
        """Replace every key of the tenant by one new key; the old ones stop working."""

    @abstractmethod
    async def delete_tenant(self, name: str) -> TenantRecord | None:
        """Remove the tenant, its keys and the adapters it owns; its usage counts stay."""

    @abstractmethod
    async def verify_api_key(self, api_key: str) -> str | None:
        """The tenant owning `api_key`, or None; compares in constant time."""

    # usage

    @abstractmethod
    async def record_usage(
        self,
        tenant: str,
        adapter: str | None,
        *,
        prompt_tokens: int,
        completion_tokens: int,
        requests: int = 1,
    ) -> None:
        """Add to the tenant's totals and, when adapter is named (a name or a key, as the
        caller named it), to that adapter's."""

    async def record_usages(self, records: list[tuple[str, str | None, UsageCounts]]) -> None:
        """Several record_usage calls, (tenant, adapter, counts) each, in one atomic step:
        one round trip on Redis, however many streams' counts it carries. A bad count is a
        ValueError, and nothing is written."""
        for tenant, adapter, c in records:
            check_usage(tenant, adapter, c.prompt_tokens, c.completion_tokens, c.requests)
        for tenant, adapter, counts in records:
            await self.record_usage(
                tenant,
                adapter,
                prompt_tokens=counts.prompt_tokens,
                completion_tokens=counts.completion_tokens,
                requests=counts.requests,
            )

    @abstractmethod
    async def get_usage(self, tenant: str) -> UsageReport:
        """The tenant's counters (zeros if it never used anything)."""

    @abstractmethod
    async def list_usage(self) -> list[UsageReport]:
        """Every tenant with counters, sorted by tenant."""

    # quotas

    @abstractmethod
    async def try_acquire_request(
        self, tenant: str, quota: TenantQuota, *, tokens: int = 0, requests: int = 1
    ) -> Admission:
        """Admit one request against concurrency, requests/minute and tokens/minute, in
        one atomic step (across replicas too).

        `tokens` is the request's worst case, reserved under its lease until it ends;
        `requests` is what it counts as in requests/minute (its sequences). It is admitted
        only if the tokens of the window, plus every live reservation, plus max(tokens, 1)
        fit in tokens_per_minute, and the window's requests plus `requests` fit in
        requests_per_minute. Minutes are sliding windows of 60 one-second buckets. An
        admitted request holds a lease until release_request, or until the lease TTL
        passes (a crashed replica cannot leak concurrency or reservations forever;
        refresh_request extends a long request's lease).
        """

    @abstractmethod
    async def release_request(self, tenant: str, lease: str, *, used_tokens: int = 0) -> bool:
        """Give a lease back: its reservation ends and `used_tokens` (what the request
        really used) count in this second of the tokens/minute window, even if the lease
        had expired. False if it had expired or was released already."""

    @abstractmethod
    async def refresh_request(self, tenant: str, lease: str) -> bool:
        """Restart a lease's TTL; False if it had expired or was released."""

    @abstractmethod
    async def in_flight(self, tenant: str) -> int:
        """Leases the tenant holds now (expired ones not counted)."""

    @abstractmethod
    async def add_tokens(self, tenant: str, tokens: int) -> None:
        """Count tokens against the tenant's tokens/minute window."""

    # changes

    @abstractmethod
    def watch(self) -> AbstractAsyncContextManager[AsyncIterator[ChangeEvent]]:
        """`async with store.watch() as events: async for event in events: ...`

        Subscribed once the `async with` is entered: every later change made through any
        store on the same backend arrives. If the backend goes away, iteration raises
        RegistryUnavailable; watch again, then catch up with changes_since().
        """

    @abstractmethod
    async def version(self) -> int:
        """A counter bumped by every adapter or tenant change: cheap to poll for resync."""

    @abstractmethod
    async def changes_since(self, version: int, *, limit: int = 1000) -> ChangeLog:
        """Up to `limit` changes made after `version`, oldest first, read in one step
        from the change log (see `loragate.registry.adapter_index`)."""


def make_registry_store(redis_url: str | None, **options) -> RegistryStore:
    """The Redis store when a URL is given, else the in-memory one."""
    # Imported here: both implementations import this module.
    if redis_url is None:
        from loragate.registry.memory import MemoryRegistryStore

        return MemoryRegistryStore(**options)
    from loragate.registry.redis_store import RedisRegistryStore

    return RedisRegistryStore(redis_url, **options)
