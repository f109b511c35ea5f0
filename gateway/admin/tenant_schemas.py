"""Bodies of the tenant-management and usage routes."""

from __future__ import annotations

from typing import Annotated

import msgspec

from loragate.registry import TenantQuota, TenantRecord, UsageCounts, UsageReport

Limit = Annotated[int, msgspec.Meta(ge=1)] | None
# A tenant's share under --scheduling-policy fair (2.0: twice the tokens of a 1.0 tenant).
Weight = Annotated[float, msgspec.Meta(gt=0, le=1e6)]


class QuotaBody(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Per-tenant limits; a missing or null field is unlimited."""

    requests_per_minute: Limit = None
    tokens_per_minute: Limit = None
    max_concurrent_requests: Limit = None
    max_adapters: Limit = None
    max_adapter_bytes: Limit = None

    def to_quota(self) -> TenantQuota:
        return TenantQuota(**msgspec.structs.asdict(self))

    @classmethod
    def of(cls, quota: TenantQuota) -> QuotaBody:
        return cls(**msgspec.structs.asdict(quota))


class CreateTenantRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    name: str
    quota: QuotaBody | None = None
    weight: Weight = 1.0


class UpdateTenantRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Either or both: a missing field keeps its value."""

    quota: QuotaBody | None = None
    weight: Weight | None = None


class TenantInfo(msgspec.Struct, kw_only=True):
    """A tenant. `key_ids` name its keys (they are not secret); the keys are never shown."""

    name: str
    object: str = "tenant"
    quota: QuotaBody
    weight: float
    created_at: float
    key_ids: list[str]

    @classmethod
    def of(cls, record: TenantRecord) -> TenantInfo:
        return cls(
            name=record.name,
            quota=QuotaBody.of(record.quota),
            weight=record.weight,
            created_at=record.created_at,
            key_ids=list(record.key_ids),
        )


class IssuedTenantKey(msgspec.Struct, kw_only=True):
    """The tenant with its new API key: shown this once, never stored in clear."""

    tenant: TenantInfo
    api_key: str


class TenantList(msgspec.Struct, kw_only=True):
    object: str = "list"
    data: list[TenantInfo]


class DeletedTenant(msgspec.Struct, kw_only=True):
    name: str
    object: str = "tenant"
    deleted: bool = True


class UsageNumbers(msgspec.Struct, kw_only=True):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    requests: int

    @classmethod
    def of(cls, counts: UsageCounts) -> UsageNumbers:
        return cls(
            prompt_tokens=counts.prompt_tokens,
            completion_tokens=counts.completion_tokens,
            total_tokens=counts.prompt_tokens + counts.completion_tokens,
            requests=counts.requests,
        )


class TenantUsage(msgspec.Struct, kw_only=True):
    """One tenant's counts since the store began: in total (base model included) and per
    adapter name."""

    tenant: str
    object: str = "usage"
    total: UsageNumbers
    by_adapter: dict[str, UsageNumbers]

    @classmethod
    def of(cls, report: UsageReport) -> TenantUsage:
        return cls(
            tenant=report.tenant,
            total=UsageNumbers.of(report.total),
            by_adapter={name: UsageNumbers.of(c) for name, c in report.by_adapter.items()},
        )


class UsageList(msgspec.Struct, kw_only=True):
    object: str = "list"
    data: list[TenantUsage]
