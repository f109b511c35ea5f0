"""GET /v1/models: the base model and every adapter the caller may name in `model`."""

from __future__ import annotations

from litestar import Controller, get
from litestar.params import FromPath

from loragate.gateway.adapter_control.records import AdapterRecord
from loragate.gateway.errors import NotFoundError
from loragate.gateway.openai.schemas import ModelCard, ModelList
from loragate.gateway.serving.service import GatewayService, Service
from loragate.gateway.tenancy.principal import Caller


class ModelsController(Controller):
    path = "/v1/models"
    tags = ["OpenAI"]

    @get("/", summary="List models and adapters")
    async def list_models(self, caller: Caller, service: Service) -> ModelList:
        adapters = await service.adapters.catalog.list(caller)
        cards = [_adapter_card(service, caller.name_of(r), r) for r in adapters]
        return ModelList(data=[_base_card(service)] + cards)

    @get("/{tenant:str}/{name:str}", summary="Admin: describe a tenant's adapter")
    async def get_tenant_model(
        self, tenant: FromPath[str], name: FromPath[str], caller: Caller, service: Service
    ) -> ModelCard:
        """The admin names a tenant's adapter `<tenant>/<name>`: two path segments."""
        return await self.get_model.fn(self, f"{tenant}/{name}", caller, service)

    @get("/{model_id:str}", summary="Describe one model or adapter")
    async def get_model(
        self, model_id: FromPath[str], caller: Caller, service: Service
    ) -> ModelCard:
        if model_id == service.model_name:
            return _base_card(service)
        record = await service.adapters.catalog.visible(caller, model_id)
        if record is None:
            raise NotFoundError(
                f"the model {model_id!r} does not exist", param="model", code="model_not_found"
            )
        return _adapter_card(service, caller.name_of(record), record)


def _base_card(service: GatewayService) -> ModelCard:
    name = service.model_name
    return ModelCard(
        id=name, created=service.started_at, root=name, max_model_len=service.max_model_len
    )


def _adapter_card(service: GatewayService, name: str, record: AdapterRecord) -> ModelCard:
    # `root` is the adapter's name as the caller uses it: file paths are never shown here.
    return ModelCard(
        id=name,
        created=record.created,
        root=name,
        parent=service.model_name,
        max_model_len=service.max_model_len,
    )
