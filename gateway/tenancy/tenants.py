"""What the tenant routes do, as one service: create, read, change, delete tenants, rotate
their keys, and read usage. Each change also tells this replica's caches (remembered keys,
the tenant's adapters) at once, before the change event comes back from the store.

The store is reached through the seam, so an outage is a 503 here without a word of it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from loragate.gateway.errors import ConflictError, InvalidRequestError, NotFoundError
from loragate.gateway.registry_seam import RegistrySeam
from loragate.gateway.tenancy.auth import Authenticator
from loragate.gateway.tenancy.principal import UNTENANTED, Principal
from loragate.gateway.tenancy.usage_meter import UsageMeter
from loragate.registry import (
    IssuedKey,
    TenantExists,
    TenantNotFound,
    TenantQuota,
    TenantRecord,
    UsageReport,
    check_tenant_name,
)


class TenantService:
    def __init__(
        self,
        store: RegistrySeam,
        auth: Authenticator,
        usage: UsageMeter,
        drop_adapters_of: Callable[[str], Awaitable[None]],
    ):
        """`drop_adapters_of(tenant)`: forgets a deleted tenant's adapters on this replica
        (the adapter manager's `drop_tenant`)."""
        self.store = store
        self.auth = auth
        self.usage_meter = usage
        self._drop_adapters_of = drop_adapters_of

    async def create(self, name: str, quota: TenantQuota | None, weight: float = 1.0) -> IssuedKey:
        try:
            check_tenant_name(name)
        except ValueError as exc:
            raise InvalidRequestError(str(exc), param="name") from exc
        if name == UNTENANTED:
            raise InvalidRequestError(
                f"tenant name {UNTENANTED!r} is reserved (usage without a tenant key)",
                param="name",
            )
        try:
            issued = await self.store.create_tenant(name, quota, weight)
        except TenantExists as exc:
            raise ConflictError(
                f"tenant {name!r} already exists", param="name", code="tenant_exists"
            ) from exc
        self.auth.forget_tenant(name)
        return issued

    async def list(self) -> list[TenantRecord]:
        return await self.store.list_tenants()

    async def get(self, name: str) -> TenantRecord:
        record = await self.store.get_tenant(_named(name))
        if record is None:
            raise _not_found(name)
        return record

    async def update(
        self, name: str, quota: TenantQuota | None, weight: float | None
    ) -> TenantRecord:
        """Replace the quota, the fair-share weight, or both (None keeps one as it is)."""
        record = None
        try:
            if quota is not None:
                record = await self.store.set_tenant_quota(_named(name), quota)
            if weight is not None:
                record = await self.store.set_tenant_weight(_named(name), weight)
        except TenantNotFound as exc:
            raise _not_found(name) from exc
        self.auth.forget_tenant(name)
        return record

    async def delete(self, name: str) -> None:
        """The tenant, its keys and its adapters go; its usage counts stay."""
        record = await self.store.delete_tenant(_named(name))
        if record is None and name not in self.auth.orphans:
            raise _not_found(name)
        self.auth.forget_tenant(name)
        await self._drop_adapters_of(name)

    async def rotate_key(self, name: str) -> IssuedKey:
        try:
            issued = await self.store.rotate_tenant_key(_named(name))
        except TenantNotFound as exc:
            raise _not_found(name) from exc
        self.auth.forget_tenant(name)
        return issued

    async def usage(self, caller: Principal) -> list[UsageReport]:
        """A tenant's own counts; the operator's view has every tenant."""
        await self.usage_meter.flush()  # counts that waited for the store come first
        if caller.tenant is not None:
            return [await self.store.get_usage(caller.tenant)]
        return await self.store.list_usage()


def _named(name: str) -> str:
    """A name no tenant can have is a tenant that does not exist (404, as in the URL)."""
    try:
        return check_tenant_name(name)
    except ValueError as exc:
        raise _not_found(name) from exc


def _not_found(name: str) -> NotFoundError:
    return NotFoundError(f"tenant {name!r} does not exist", param="name", code="tenant_not_found")
