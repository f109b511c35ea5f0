"""Adapter management: register, list, describe, share and delete, plus vLLM's load/unload
aliases. Each caller sees and changes only what it may: another tenant's adapter is a 404 in
every one of these routes, exactly like a missing one. A tenant names adapters in its own
namespace (`/v1/adapters/sql`); the admin names a tenant's as `/v1/adapters/acme/sql`."""

from __future__ import annotations

from urllib.parse import urlsplit

from litestar import Controller, Request, Response, delete, get, patch, post
from litestar.params import FromPath, FromQuery, JSONBody

from loragate.gateway.adapter_control.catalog import AdapterCatalog
from loragate.gateway.adapter_control.listing import list_page
from loragate.gateway.adapter_control.manager import AdapterManager
from loragate.gateway.adapter_control.served_adapters import AdapterRecord
from loragate.gateway.adapter_control.uploads import AdapterUploads
from loragate.gateway.admin.schemas import (
    AdapterInfo,
    AdapterList,
    DeletedAdapter,
    LoadLoRAAdapterRequest,
    PatchAdapterRequest,
    RegisterAdapterRequest,
    UnloadLoRAAdapterRequest,
)
from loragate.gateway.errors import InvalidRequestError, PermissionDeniedError
from loragate.gateway.serving.served_model import ServedModel
from loragate.gateway.tenancy.principal import Caller, Principal, caller_of
from loragate.registry.adapter_index import DEFAULT_PAGE_SIZE


async def upload_files(request: Request) -> AdapterInfo | None:
    """A multipart/form-data POST is an upload: read here, from the connection as it streams
    (Litestar would read the whole body first); any other body goes on to `register`."""
    content_type = request.headers.get("content-type", "")
    if not content_type.lower().startswith("multipart/form-data"):
        return None
    # A before_request hook gets no dependencies: it reads the services the app keeps.
    services = request.app.state.services
    uploads: AdapterUploads = services.uploads
    served_model: ServedModel = services.served_model
    caller = caller_of(request)
    length = request.headers.get("content-length", "")
    staged = await uploads.receive(
        request.receive, content_type, int(length) if length.isdigit() else None
    )
    record = await uploads.register_upload(staged, caller)
    return adapter_info(served_model.model_name, record, caller)


class AdaptersController(Controller):
    path = "/v1/adapters"
    tags = ["Adapters"]

    @post(
        "/",
        status_code=201,
        summary="Register an adapter: upload its files (multipart/form-data), name a source "
        "URI, or a directory under --adapter-root",
        before_request=upload_files,
    )
    async def register(
        self,
        data: JSONBody[RegisterAdapterRequest],
        caller: Caller,
        adapters: AdapterManager,
        uploads: AdapterUploads,
        served_model: ServedModel,
    ) -> AdapterInfo:
        if (data.path is None) == (data.source is None):
            raise InvalidRequestError(
                "send exactly one of 'path' (a directory under the adapter root) and "
                "'source' (an s3:// or file:// URI)",
                param="path" if data.path is None else "source",
            )
        if data.source is not None:
            record = await uploads.register_source(
                data.name, data.source, caller, data.public, data.replace
            )
        else:
            record = await adapters.register(
                data.name, data.path, caller=caller, public=data.public, replace=data.replace
            )
        return adapter_info(served_model.model_name, record, caller)

    @get("/", summary="List the adapters the caller may use, a page at a time")
    async def list_adapters(
        self,
        caller: Caller,
        catalog: AdapterCatalog,
        served_model: ServedModel,
        limit: FromQuery[int] = DEFAULT_PAGE_SIZE,
        after: FromQuery[str | None] = None,
    ) -> AdapterList:
        """Up to `limit` (1-1000) adapters after the id `after`, in id order (a key for the
        admin, a name for a tenant); ask again with after=`last_id` while `has_more`."""
        page = await list_page(catalog, caller, after, limit)
        data = [adapter_info(served_model.model_name, r, caller) for r in page.records]
        return AdapterList(
            data=data,
            first_id=data[0].name if data else None,
            last_id=data[-1].name if data else None,
            has_more=page.has_more,
        )

    @get("/{name:str}", summary="Describe one adapter")
    async def get_adapter(
        self,
        name: FromPath[str],
        caller: Caller,
        adapters: AdapterManager,
        served_model: ServedModel,
    ) -> AdapterInfo:
        return adapter_info(
            served_model.model_name, await adapters.lookup(name, "name", caller), caller
        )

    @get("/{tenant:str}/{name:str}", summary="Admin: describe a tenant's adapter")
    async def get_tenant_adapter(
        self,
        tenant: FromPath[str],
        name: FromPath[str],
        caller: Caller,
        adapters: AdapterManager,
        served_model: ServedModel,
    ) -> AdapterInfo:
        return await self.get_adapter.fn(self, f"{tenant}/{name}", caller, adapters, served_model)

    @patch("/{name:str}", summary="Admin only: share an adapter with every tenant, or stop")
    async def patch_adapter(
        self,
        name: FromPath[str],
        data: JSONBody[PatchAdapterRequest],
        caller: Caller,
        adapters: AdapterManager,
        served_model: ServedModel,
    ) -> AdapterInfo:
        await adapters.lookup(name, "name", caller)  # 404 first, as for a missing one
        if not caller.is_operator:
            raise PermissionDeniedError(
                "only the admin may change whether an adapter is public", code="admin_only"
            )
        record = await adapters.set_public(name, data.public)
        return adapter_info(served_model.model_name, record, caller)

    @patch("/{tenant:str}/{name:str}", summary="Admin only: share a tenant's adapter, or stop")
    async def patch_tenant_adapter(
        self,
        tenant: FromPath[str],
        name: FromPath[str],
        data: JSONBody[PatchAdapterRequest],
        caller: Caller,
        adapters: AdapterManager,
        served_model: ServedModel,
    ) -> AdapterInfo:
        return await self.patch_adapter.fn(
            self, f"{tenant}/{name}", data, caller, adapters, served_model
        )

    @delete(
        "/{name:str}",
        status_code=200,
        summary="Delete an adapter; requests already using it finish first",
    )
    async def delete_adapter(
        self, name: FromPath[str], caller: Caller, adapters: AdapterManager
    ) -> DeletedAdapter:
        await adapters.unregister(name, caller)
        return DeletedAdapter(name=name)

    @delete("/{tenant:str}/{name:str}", status_code=200, summary="Admin: delete a tenant's adapter")
    async def delete_tenant_adapter(
        self,
        tenant: FromPath[str],
        name: FromPath[str],
        caller: Caller,
        adapters: AdapterManager,
    ) -> DeletedAdapter:
        return await self.delete_adapter.fn(self, f"{tenant}/{name}", caller, adapters)


class VLLMLoRAController(Controller):
    """vLLM's runtime LoRA endpoints, answering as vLLM does (plain text on success)."""

    path = "/v1"
    tags = ["Adapters"]

    @post("/load_lora_adapter", status_code=200, summary="vLLM alias of POST /v1/adapters")
    async def load(
        self,
        data: JSONBody[LoadLoRAAdapterRequest],
        caller: Caller,
        adapters: AdapterManager,
        uploads: AdapterUploads,
    ) -> Response[str]:
        if urlsplit(data.lora_path).scheme in ("s3", "file"):  # a source URI, as Dynamo takes
            await uploads.register_source(data.lora_name, data.lora_path, caller, None, False)
        else:
            await adapters.register(data.lora_name, data.lora_path, caller=caller)
        return Response(
            f"Success: LoRA adapter '{data.lora_name}' added successfully.", media_type="text/plain"
        )

    @post(
        "/unload_lora_adapter", status_code=200, summary="vLLM alias of DELETE /v1/adapters/{name}"
    )
    async def unload(
        self,
        data: JSONBody[UnloadLoRAAdapterRequest],
        caller: Caller,
        adapters: AdapterManager,
    ) -> Response[str]:
        await adapters.unregister(data.lora_name, caller)
        return Response(
            f"Success: LoRA adapter '{data.lora_name}' removed successfully.",
            media_type="text/plain",
        )


def _within_owner(record: AdapterRecord) -> str:
    """A shared adapter's path inside its owner's folder: the folder would name the owner."""
    prefix = f"{record.tenant}/"
    if record.tenant is not None and record.display_path.startswith(prefix):
        return record.display_path[len(prefix) :]
    return record.display_path


def adapter_info(parent: str, record: AdapterRecord, caller: Principal) -> AdapterInfo:
    """What `caller` may know of `record`, an adapter of the model named `parent`: a public
    adapter's owner stays hidden from tenants (owner and folder), and its name is the one the
    caller uses (a key, `<tenant>/<name>`, only for the admin)."""
    return AdapterInfo(
        name=caller.name_of(record),
        id=record.lora_request.lora_int_id,
        parent=parent,
        path=record.display_path if caller.owns(record) else _within_owner(record),
        rank=record.rank,
        alpha=record.alpha,
        target_modules=list(record.target_modules),
        sha256=record.sha256,
        size_bytes=record.size_bytes,
        created=record.created,
        source=record.source,
        owner=record.tenant if caller.owns(record) else None,
        public=record.public,
        kind=record.kind,
    )
