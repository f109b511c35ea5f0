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
  (see `loragate.adapters.api_keys`), so verification is one lookup and one
  constant-time comparison.
- A store that cannot reach its backend raises `RegistryUnavailable` from every method;
  whether to serve from a local cache then is the caller's choice.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from enum import StrEnum

import msgspec

ADAPTER_STATUSES = ("loading", "ready", "deleting")

_ADAPTER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")
_TENANT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_SHA256 = re.compile(r"[0-9a-f]{64}")


class RegistryError(Exception):
    """Base of every error the registry store raises on purpose."""


class RegistryUnavailable(RegistryError):
    """The store's backend (Redis) cannot be reached; nothing was read or written."""


class AdapterNameTaken(RegistryError):
    """The owner registered this name already and replace=False was asked."""

    def __init__(self, key: str):
        super().__init__(f"adapter {key!r} is already registered (replace=False)")
        self.key = key


class PublicNameTaken(RegistryError):
    """Another public adapter has this name: public names must be unique to resolve."""

    def __init__(self, name: str, holder: str):
        super().__init__(f"public adapter name {name!r} is already used by {holder!r}")
        self.name = name
        self.holder = holder


class AdapterQuotaExceeded(RegistryError):
    """The tenant already owns max_adapters adapters."""

    def __init__(self, tenant: str, limit: int):
        super().__init__(f"tenant {tenant!r} already owns its maximum of {limit} adapters")
        self.tenant = tenant
        self.limit = limit


class StaleAdapterId(RegistryError):
    """lora_int_id was not handed out by this store, or is the one being replaced."""


class TenantExists(RegistryError):
    def __init__(self, name: str):
        super().__init__(f"tenant {name!r} already exists")
        self.name = name


class TenantNotFound(RegistryError):
    def __init__(self, name: str):
        super().__init__(f"tenant {name!r} does not exist")
        self.name = name


def check_adapter_name(name: object) -> str:
    """Adapter names appear in URLs and in the `model` field: short and plain."""
    if not isinstance(name, str) or not _ADAPTER_NAME.fullmatch(name):
        raise ValueError(
            "adapter name must be 1-128 characters of letters, digits, '.', '_', ':' or '-', "
            f"starting with a letter or digit; got {name!r}"
        )
    return name


def adapter_key(tenant: str | None, name: str) -> str:
    """Where an adapter lives: `<tenant>/<name>` in a tenant's namespace, `<name>` in the
    operator's. Neither a tenant nor an adapter name holds a '/', so keys never clash."""
    return name if tenant is None else f"{tenant}/{name}"


def split_adapter_key(key: object) -> tuple[str | None, str]:
    """(tenant or None, name) of a key; ValueError naming what is wrong with it."""
    if not isinstance(key, str):
        raise ValueError(f"adapter key must be a string, got {key!r}")
    tenant, sep, name = key.rpartition("/")
    if not sep:
        return None, check_adapter_name(key)
    return check_tenant_name(tenant), check_adapter_name(name)


def check_adapter_key(key: object) -> str:
    split_adapter_key(key)
    return key


def check_tenant_name(name: object) -> str:
    """Tenant names become part of storage keys: no separators, no wildcards."""
    if not isinstance(name, str) or not _TENANT_NAME.fullmatch(name):
        raise ValueError(
            "tenant name must be 1-64 characters of letters, digits, '.', '_' or '-', "
            f"starting with a letter or digit; got {name!r}"
        )
    return name


def check_count(field_name: str, value: object, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{field_name} must be an int >= {minimum}, got {value!r}")
    return value


def _check_limit(field_name: str, value: object) -> None:
    if value is not None:
        check_count(field_name, value, minimum=1)


class TenantQuota(msgspec.Struct, frozen=True, kw_only=True):
    """Per-tenant limits; None means unlimited."""

    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    max_concurrent_requests: int | None = None
    max_adapters: int | None = None

    def __post_init__(self):
        for name in self.__struct_fields__:
            _check_limit(name, getattr(self, name))


class TenantRecord(msgspec.Struct, frozen=True, kw_only=True):
    """A tenant as clients may see it: key_ids name its keys, the hashes stay in the store."""

    name: str
    quota: TenantQuota
    created_at: float
    key_ids: tuple[str, ...] = ()


@dataclass(frozen=True)
class IssuedKey:
    """A freshly created key: the only time it exists in clear. Its repr hides it."""

    tenant: TenantRecord
    api_key: str = field(repr=False)


class AdapterSpec(msgspec.Struct, frozen=True, kw_only=True):
    """What a caller registers; the store adds lora_int_id and created_at."""

    name: str
    tenant: str | None = None
    public: bool = False
    base_model: str
    rank: int
    alpha: float
    target_modules: tuple[str, ...]
    sha256: str
    size_bytes: int
    path: str
    status: str = "ready"

    def __post_init__(self):
        check_adapter_name(self.name)
        if self.tenant is not None:
            check_tenant_name(self.tenant)
        if not isinstance(self.public, bool):
            raise ValueError(f"public must be a bool, got {self.public!r}")
        if not isinstance(self.base_model, str) or not self.base_model:
            raise ValueError(f"base_model must be a non-empty string, got {self.base_model!r}")
        check_count("rank", self.rank, minimum=1)
        if isinstance(self.alpha, bool) or not isinstance(self.alpha, int | float):
            raise ValueError(f"alpha must be a number, got {self.alpha!r}")
        if not self.alpha > 0:
            raise ValueError(f"alpha must be > 0, got {self.alpha!r}")
        modules = self.target_modules
        if (
            not isinstance(modules, tuple | list)
            or not modules
            or not all(isinstance(m, str) and m for m in modules)
        ):
            raise ValueError(f"target_modules must be non-empty module names, got {modules!r}")
        msgspec.structs.force_setattr(self, "target_modules", tuple(modules))
        msgspec.structs.force_setattr(self, "alpha", float(self.alpha))
        if not isinstance(self.sha256, str) or not _SHA256.fullmatch(self.sha256):
            raise ValueError(f"sha256 must be 64 lowercase hex digits, got {self.sha256!r}")
        check_count("size_bytes", self.size_bytes)
        if not isinstance(self.path, str) or not self.path:
            raise ValueError(f"path must be a non-empty string, got {self.path!r}")
        if self.status not in ADAPTER_STATUSES:
            raise ValueError(f"status must be one of {ADAPTER_STATUSES}, got {self.status!r}")


class AdapterWeights(msgspec.Struct, frozen=True, kw_only=True):
    """What an adapter's files say about it; a registration takes new ones when its files
    change in place (checked as AdapterSpec checks them, when applied)."""

    rank: int
    alpha: float
    target_modules: tuple[str, ...]
    sha256: str
    size_bytes: int


class AdapterMetadata(AdapterSpec, frozen=True, kw_only=True):
    """One registration. A new registration of the same name is a new lora_int_id."""

    lora_int_id: int
    created_at: float

    def __post_init__(self):
        super().__post_init__()
        check_count("lora_int_id", self.lora_int_id, minimum=1)

    @property
    def key(self) -> str:
        return adapter_key(self.tenant, self.name)

    def visible_to(self, tenant: str | None) -> bool:
        """The admin (None) sees every adapter; a tenant sees its own and public ones."""
        return tenant is None or self.public or self.tenant == tenant


class Registration(msgspec.Struct, frozen=True):
    """What register_adapter did: the new record and the one it replaced, if any."""

    adapter: AdapterMetadata
    replaced: AdapterMetadata | None = None


class UsageCounts(msgspec.Struct, frozen=True):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    requests: int = 0


class UsageReport(msgspec.Struct, frozen=True):
    """A tenant's counters since the store began: in total and per adapter name."""

    tenant: str
    total: UsageCounts
    by_adapter: dict[str, UsageCounts]


class Admission(msgspec.Struct, frozen=True):
    """try_acquire_request's answer.

    ok: admitted; then `lease` must be given back to release_request when it finishes
    (the tokens it reserved stay reserved until then). Otherwise `reason` names the
    TenantQuota field that refused it and `retry_after` is the whole number of seconds
    (>= 1) after which asking again can succeed.
    """

    ok: bool
    retry_after: int = 0
    reason: str = ""
    lease: str | None = None


class ChangeKind(StrEnum):
    ADAPTER_REGISTERED = "adapter_registered"
    ADAPTER_UPDATED = "adapter_updated"
    ADAPTER_DELETED = "adapter_deleted"
    TENANT_CREATED = "tenant_created"
    TENANT_UPDATED = "tenant_updated"
    TENANT_DELETED = "tenant_deleted"


class ChangeEvent(msgspec.Struct, frozen=True):
    """Something another replica may hold in a cache changed; re-read `name` (a tenant's
    name, or an adapter's key)."""

    kind: ChangeKind
    name: str


def adapter_changes(
    status: str | None, public: bool | None, weights: AdapterWeights | None
) -> dict:
    """The fields update_adapter sets."""
    changes = {k: v for k, v in (("status", status), ("public", public)) if v is not None}
    if weights is not None:
        changes.update(msgspec.structs.asdict(weights))
    return changes


def check_quota(quota: object) -> TenantQuota:
    if not isinstance(quota, TenantQuota):
        raise ValueError(f"quota must be a TenantQuota, got {type(quota).__name__}")
    return quota


def check_lease_ttl(lease_ttl_s: object) -> float:
    if isinstance(lease_ttl_s, bool) or not isinstance(lease_ttl_s, int | float):
        raise ValueError(f"lease_ttl_s must be a number of seconds, got {lease_ttl_s!r}")
    if not lease_ttl_s > 0:
        raise ValueError(f"lease_ttl_s must be > 0, got {lease_ttl_s!r}")
    return float(lease_ttl_s)


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
    async def list_adapters(self) -> list[AdapterMetadata]:
        """Every adapter, sorted by key."""

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
    async def create_tenant(self, name: str, quota: TenantQuota | None = None) -> IssuedKey:
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
        RegistryUnavailable; watch again, then resync with list_adapters().
        """

    @abstractmethod
    async def version(self) -> int:
        """A counter bumped by every adapter or tenant change: cheap to poll for resync."""


def make_registry_store(redis_url: str | None, **options) -> RegistryStore:
    """The Redis store when a URL is given, else the in-memory one."""
    # Imported here: both implementations import this module.
    if redis_url is None:
        from loragate.adapters.registry_memory import MemoryRegistryStore

        return MemoryRegistryStore(**options)
    from loragate.adapters.registry_redis import RedisRegistryStore

    return RedisRegistryStore(redis_url, **options)
