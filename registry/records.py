"""The plain data the registry store keeps and answers with (msgspec Structs), each checked
where it is built, so no store holds a record it could not serve."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import StrEnum

import msgspec

from loragate.registry.names import (
    adapter_key,
    check_adapter_key,
    check_adapter_name,
    check_tenant_name,
)

ADAPTER_STATUSES = ("loading", "ready", "deleting")

_SHA256 = re.compile(r"[0-9a-f]{64}")
_STORE_OBJECT = re.compile(r"[0-9a-f]{64}-[0-9a-f]{64}")
_KIND = re.compile(r"(lora|dora|lora\+bias)(\+(saved-modules|vocab-lora|trainable-tokens))*")


def check_adapter_kind(value: object) -> str:
    """An adapter's kind as the loader names it: "lora", "dora", "lora+bias", each maybe
    with "+saved-modules", "+vocab-lora", "+trainable-tokens"."""
    if not isinstance(value, str) or not _KIND.fullmatch(value):
        raise ValueError(f"kind must be an adapter kind such as 'lora' or 'dora', got {value!r}")
    return value


def check_store_object(value: object) -> str:
    """An adapter store object id: `<weights sha256>-<config sha256>`."""
    if not isinstance(value, str) or not _STORE_OBJECT.fullmatch(value):
        raise ValueError(f"store_object must be <sha256>-<sha256> in lowercase hex, got {value!r}")
    return value


def check_count(field_name: str, value: object, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{field_name} must be an int >= {minimum}, got {value!r}")
    return value


def _check_limit(field_name: str, value: object) -> None:
    if value is not None:
        check_count(field_name, value, minimum=1)


class TenantQuota(msgspec.Struct, frozen=True, kw_only=True):
    """Per-tenant limits; None means unlimited. `max_adapter_bytes` bounds the sum of the
    weights' sizes over the tenant's adapters (each name counts, even when its bytes are
    stored once for several)."""

    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    max_concurrent_requests: int | None = None
    max_adapters: int | None = None
    max_adapter_bytes: int | None = None

    def __post_init__(self):
        for name in self.__struct_fields__:
            _check_limit(name, getattr(self, name))


def check_weight(weight: object) -> float:
    """A tenant's share under fair scheduling: a finite number > 0."""
    if (
        isinstance(weight, bool)
        or not isinstance(weight, int | float)
        or not 0 < weight < float("inf")
    ):
        raise ValueError(f"weight must be a finite number > 0, got {weight!r}")
    return float(weight)


class TenantRecord(msgspec.Struct, frozen=True, kw_only=True):
    """A tenant as clients may see it: key_ids name its keys, the hashes stay in the store.
    `weight` is its share under the `fair` scheduling policy (2.0: twice the tokens of a
    tenant of weight 1.0 when both wait); records written before it existed read as 1.0."""

    name: str
    quota: TenantQuota
    created_at: float
    key_ids: tuple[str, ...] = ()
    weight: float = 1.0

    def __post_init__(self):
        msgspec.structs.force_setattr(self, "weight", check_weight(self.weight))


@dataclass(frozen=True)
class IssuedKey:
    """A freshly created key: the only time it exists in clear. Its repr hides it."""

    tenant: TenantRecord
    api_key: str = field(repr=False)


class AdapterSpec(msgspec.Struct, frozen=True, kw_only=True):
    """What a caller registers; the store adds lora_int_id and created_at. `store_object`
    is the adapter store's object id (`<sha256>-<config sha256>`) of uploaded adapters and
    of those fetched from a source URI: every replica fetches the files by it; None for an
    adapter served from its folder under the adapter root (`path`)."""

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
    store_object: str | None = None
    kind: str = "lora"  # the loaded adapter's kind (records from before kinds are "lora")

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
        if self.store_object is not None:
            check_store_object(self.store_object)
        check_adapter_kind(self.kind)


class AdapterWeights(msgspec.Struct, frozen=True, kw_only=True):
    """What an adapter's files say about it; a registration takes new ones when its files
    change in place (checked as AdapterSpec checks them, when applied). `store_object`: the
    adapter store's copy of the new files (None: none)."""

    rank: int
    alpha: float
    target_modules: tuple[str, ...]
    sha256: str
    size_bytes: int
    store_object: str | None = None
    kind: str = "lora"


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
    # A backup was restored: every record may have changed at once (one announcement for
    # the whole import); a replica re-reads what it holds. Its name is RESTORED_NAME.
    REGISTRY_RESTORED = "registry_restored"


RESTORED_NAME = "*"


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


def check_usage(
    tenant: object,
    adapter: object,
    prompt_tokens: object,
    completion_tokens: object,
    requests: object,
) -> UsageCounts:
    """What record_usage adds, checked: a tenant, an adapter key or None, and counts."""
    check_tenant_name(tenant)
    if adapter is not None:
        check_adapter_key(adapter)
    return UsageCounts(
        check_count("prompt_tokens", prompt_tokens),
        check_count("completion_tokens", completion_tokens),
        check_count("requests", requests),
    )


def check_lease_ttl(lease_ttl_s: object) -> float:
    if isinstance(lease_ttl_s, bool) or not isinstance(lease_ttl_s, int | float):
        raise ValueError(f"lease_ttl_s must be a number of seconds, got {lease_ttl_s!r}")
    if not lease_ttl_s > 0:
        raise ValueError(f"lease_ttl_s must be > 0, got {lease_ttl_s!r}")
    return float(lease_ttl_s)
