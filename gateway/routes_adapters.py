"""Adapter management: register, list, describe and delete, plus vLLM's load/unload aliases."""

from __future__ import annotations

from litestar import Controller, Response, delete, get, post
from litestar.params import FromPath, JSONBody

from loragate.gateway.registry import AdapterRecord
from loragate.gateway.schemas_admin import (
    AdapterInfo,
    AdapterList,
    DeletedAdapter,
    LoadLoRAAdapterRequest,
    RegisterAdapterRequest,
    UnloadLoRAAdapterRequest,
)
from loragate.gateway.service import GatewayService, Service


class AdaptersController(Controller):
    path = "/v1/adapters"
    tags = ["Adapters"]

    @post("/", status_code=201, summary="Register an adapter from a directory under --adapter-root")
    async def register(
        self, data: JSONBody[RegisterAdapterRequest], service: Service
    ) -> AdapterInfo:
        record = await service.adapters.register(data.name, data.path)
        return adapter_info(service, record)

    @get("/", summary="List registered adapters")
    async def list_adapters(self, service: Service) -> AdapterList:
        return AdapterList(data=[adapter_info(service, r) for r in await service.registry.list()])

    @get("/{name:str}", summary="Describe one adapter")
    async def get_adapter(self, name: FromPath[str], service: Service) -> AdapterInfo:
        return adapter_info(service, await service.adapters.lookup(name, "name"))

    @delete(
        "/{name:str}",
        status_code=200,
        summary="Delete an adapter; requests already using it finish first",
    )
    async def delete_adapter(self, name: FromPath[str], service: Service) -> DeletedAdapter:
        await service.adapters.unregister(name)
        return DeletedAdapter(name=name)


class VLLMLoRAController(Controller):
    """vLLM's runtime LoRA endpoints, answering as vLLM does (plain text on success)."""

    path = "/v1"
    tags = ["Adapters"]

    @post("/load_lora_adapter", status_code=200, summary="vLLM alias of POST /v1/adapters")
    async def load(self, data: JSONBody[LoadLoRAAdapterRequest], service: Service) -> Response[str]:
        await service.adapters.register(data.lora_name, data.lora_path)
        return Response(
            f"Success: LoRA adapter '{data.lora_name}' added successfully.", media_type="text/plain"
        )

    @post(
        "/unload_lora_adapter", status_code=200, summary="vLLM alias of DELETE /v1/adapters/{name}"
    )
    async def unload(
        self, data: JSONBody[UnloadLoRAAdapterRequest], service: Service
    ) -> Response[str]:
        await service.adapters.unregister(data.lora_name)
        return Response(
            f"Success: LoRA adapter '{data.lora_name}' removed successfully.",
            media_type="text/plain",
        )


def adapter_info(service: GatewayService, record: AdapterRecord) -> AdapterInfo:
    return AdapterInfo(
        name=record.name,
        id=record.lora_request.lora_int_id,
        parent=service.model_name,
        path=record.display_path,
        rank=record.rank,
        alpha=record.alpha,
        target_modules=list(record.target_modules),
        sha256=record.sha256,
        size_bytes=record.size_bytes,
        created=record.created,
        source=record.source,
    )
