"""Tenants (admin only) and usage: create, list, change, delete, rotate keys; read usage.

Tenants exist only on a server started with --admin-key (an open server has one implicit
tenant, the operator). Everything here reads or writes the registry store, so while it is
unreachable these routes answer 503.
"""

from __future__ import annotations

from litestar import Controller, delete, get, patch, post
from litestar.params import FromPath, JSONBody

from loragate.gateway.errors import (
    ConflictError,
    InvalidRequestError,
    NotFoundError,
    PermissionDeniedError,
    RegistryDownError,
)
from loragate.gateway.schemas_tenants import (
    CreateTenantRequest,
    DeletedTenant,
    IssuedTenantKey,
    TenantInfo,
    TenantList,
    TenantUsage,
    UpdateTenantRequest,
    UsageList,
)
from loragate.gateway.service import GatewayService, Service
from loragate.gateway.tenancy import UNTENANTED, Caller, Principal
from loragate.registry import RegistryUnavailable, TenantExists, TenantNotFound, check_tenant_name


def require_admin(caller: Principal, service: GatewayService) -> None:
    if not service.auth.enabled:
        raise InvalidRequestError(
            "tenants need an admin key: this server runs open (single-tenant); start it with "
            "--admin-key to manage tenants",
            code="tenancy_disabled",
        )
    if not caller.is_operator:
        raise PermissionDeniedError("this endpoint needs the admin key", code="admin_only")


def _registry_down(action: str) -> RegistryDownError:
    return RegistryDownError(
        f"the tenant registry is unreachable, so {action} is not possible right now; "
        "tenants already known keep being served. Retry later.",
        code="registry_unavailable",
        headers={"Retry-After": "1"},
    )


def _not_found(name: str) -> NotFoundError:
    return NotFoundError(f"tenant {name!r} does not exist", param="name", code="tenant_not_found")


class TenantsController(Controller):
    path = "/v1/tenants"
    tags = ["Tenants"]

    @post("/", status_code=201, summary="Create a tenant; its API key is shown this once")
    async def create(
        self, data: JSONBody[CreateTenantRequest], caller: Caller, service: Service
    ) -> IssuedTenantKey:
        require_admin(caller, service)
        try:
            check_tenant_name(data.name)
        except ValueError as exc:
            raise InvalidRequestError(str(exc), param="name") from exc
        if data.name == UNTENANTED:
            raise InvalidRequestError(
                f"tenant name {UNTENANTED!r} is reserved (usage without a tenant key)",
                param="name",
            )
        quota = data.quota.to_quota() if data.quota is not None else None
        try:
            with service.health.noting():
                issued = await service.store.create_tenant(data.name, quota)
        except RegistryUnavailable as exc:
            raise _registry_down("creating a tenant") from exc
        except TenantExists as exc:
            raise ConflictError(
                f"tenant {data.name!r} already exists", param="name", code="tenant_exists"
            ) from exc
        service.auth.forget_tenant(data.name)
        return IssuedTenantKey(tenant=TenantInfo.of(issued.tenant), api_key=issued.api_key)

    @get("/", summary="List tenants")
    async def list_tenants(self, caller: Caller, service: Service) -> TenantList:
        require_admin(caller, service)
        try:
            with service.health.noting():
                tenants = await service.store.list_tenants()
        except RegistryUnavailable as exc:
            raise _registry_down("listing tenants") from exc
        return TenantList(data=[TenantInfo.of(t) for t in tenants])

    @get("/{name:str}", summary="Describe one tenant")
    async def get_tenant(self, name: FromPath[str], caller: Caller, service: Service) -> TenantInfo:
        require_admin(caller, service)
        try:
            check_tenant_name(name)
            with service.health.noting():
                record = await service.store.get_tenant(name)
        except ValueError:
            record = None
        except RegistryUnavailable as exc:
            raise _registry_down("reading a tenant") from exc
        if record is None:
            raise _not_found(name)
        return TenantInfo.of(record)

    @patch("/{name:str}", summary="Change a tenant's quota")
    async def update(
        self,
        name: FromPath[str],
        data: JSONBody[UpdateTenantRequest],
        caller: Caller,
        service: Service,
    ) -> TenantInfo:
        require_admin(caller, service)
        try:
            check_tenant_name(name)
            with service.health.noting():
                record = await service.store.set_tenant_quota(name, data.quota.to_quota())
        except (ValueError, TenantNotFound) as exc:
            raise _not_found(name) from exc
        except RegistryUnavailable as exc:
            raise _registry_down("changing a tenant") from exc
        service.auth.forget_tenant(name)
        return TenantInfo.of(record)

    @delete(
        "/{name:str}",
        status_code=200,
        summary="Delete a tenant, its keys and its adapters (its usage counts stay)",
    )
    async def delete_tenant(
        self, name: FromPath[str], caller: Caller, service: Service
    ) -> DeletedTenant:
        require_admin(caller, service)
        try:
            check_tenant_name(name)
            with service.health.noting():
                record = await service.store.delete_tenant(name)
        except ValueError as exc:
            raise _not_found(name) from exc
        except RegistryUnavailable as exc:
            raise _registry_down("deleting a tenant") from exc
        orphaned = name in service.auth.orphans
        if record is None and not orphaned:
            raise _not_found(name)
        service.auth.forget_tenant(name)
        await service.adapters.drop_tenant(name)
        return DeletedTenant(name=name)

    @post(
        "/{name:str}/keys",
        status_code=201,
        summary="Rotate a tenant's key: a new key, shown this once; the old ones stop working",
    )
    async def rotate_key(
        self, name: FromPath[str], caller: Caller, service: Service
    ) -> IssuedTenantKey:
        require_admin(caller, service)
        try:
            check_tenant_name(name)
            with service.health.noting():
                issued = await service.store.rotate_tenant_key(name)
        except (ValueError, TenantNotFound) as exc:
            raise _not_found(name) from exc
        except RegistryUnavailable as exc:
            raise _registry_down("rotating a key") from exc
        service.auth.forget_tenant(name)
        return IssuedTenantKey(tenant=TenantInfo.of(issued.tenant), api_key=issued.api_key)


class UsageController(Controller):
    path = "/v1/usage"
    tags = ["Tenants"]

    @get("/", summary="Usage: a tenant's own counts; the admin's view has every tenant")
    async def usage(self, caller: Caller, service: Service) -> UsageList:
        await service.usage_meter.flush()  # counts that waited for the store come first
        try:
            with service.health.noting():
                if caller.tenant is not None:
                    reports = [await service.store.get_usage(caller.tenant)]
                else:
                    reports = await service.store.list_usage()
        except RegistryUnavailable as exc:
            raise _registry_down("reading usage") from exc
        return UsageList(data=[TenantUsage.of(r) for r in reports])
