"""Tenants (admin only) and usage: create, list, change, delete, rotate keys; read usage.

Tenants exist only on a server started with --admin-key (an open server has one implicit
tenant, the operator). The routes only translate HTTP: the tenant service does the work,
and the store seam answers 503 while the registry store is unreachable.
"""

from __future__ import annotations

from litestar import Controller, delete, get, patch, post
from litestar.params import FromPath, JSONBody

from loragate.gateway.admin.guards import admin_only, tenancy_enabled
from loragate.gateway.admin.tenant_schemas import (
    CreateTenantRequest,
    DeletedTenant,
    IssuedTenantKey,
    TenantInfo,
    TenantList,
    TenantUsage,
    UpdateTenantRequest,
    UsageList,
)
from loragate.gateway.errors import InvalidRequestError
from loragate.gateway.tenancy.principal import Caller
from loragate.gateway.tenancy.tenants import TenantService


class TenantsController(Controller):
    path = "/v1/tenants"
    tags = ["Tenants"]
    guards = [tenancy_enabled, admin_only]

    @post("/", status_code=201, summary="Create a tenant; its API key is shown this once")
    async def create(
        self, data: JSONBody[CreateTenantRequest], tenants: TenantService
    ) -> IssuedTenantKey:
        quota = data.quota.to_quota() if data.quota is not None else None
        issued = await tenants.create(data.name, quota, data.weight)
        return IssuedTenantKey(tenant=TenantInfo.of(issued.tenant), api_key=issued.api_key)

    @get("/", summary="List tenants")
    async def list_tenants(self, tenants: TenantService) -> TenantList:
        return TenantList(data=[TenantInfo.of(t) for t in await tenants.list()])

    @get("/{name:str}", summary="Describe one tenant")
    async def get_tenant(self, name: FromPath[str], tenants: TenantService) -> TenantInfo:
        return TenantInfo.of(await tenants.get(name))

    @patch("/{name:str}", summary="Change a tenant's quota or fair-share weight")
    async def update(
        self,
        name: FromPath[str],
        data: JSONBody[UpdateTenantRequest],
        tenants: TenantService,
    ) -> TenantInfo:
        if data.quota is None and data.weight is None:
            raise InvalidRequestError("send a quota, a weight or both", param="quota")
        quota = data.quota.to_quota() if data.quota is not None else None
        return TenantInfo.of(await tenants.update(name, quota, data.weight))

    @delete(
        "/{name:str}",
        status_code=200,
        summary="Delete a tenant, its keys and its adapters (its usage counts stay)",
    )
    async def delete_tenant(self, name: FromPath[str], tenants: TenantService) -> DeletedTenant:
        await tenants.delete(name)
        return DeletedTenant(name=name)

    @post(
        "/{name:str}/keys",
        status_code=201,
        summary="Rotate a tenant's key: a new key, shown this once; the old ones stop working",
    )
    async def rotate_key(self, name: FromPath[str], tenants: TenantService) -> IssuedTenantKey:
        issued = await tenants.rotate_key(name)
        return IssuedTenantKey(tenant=TenantInfo.of(issued.tenant), api_key=issued.api_key)


class UsageController(Controller):
    path = "/v1/usage"
    tags = ["Tenants"]

    @get("/", summary="Usage: a tenant's own counts; the admin's view has every tenant")
    async def usage(self, caller: Caller, tenants: TenantService) -> UsageList:
        reports = await tenants.usage(caller)
        return UsageList(data=[TenantUsage.of(r) for r in reports])
