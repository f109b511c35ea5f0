"""GET /v1/models: the base model and every adapter the caller may name in `model`."""

from __future__ import annotations

from litestar import Controller, get
from litestar.di import NamedDependency
from litestar.params import FromPath

from loragate.gateway.adapter_control.catalog import AdapterCatalog
from loragate.gateway.adapter_control.records import AdapterRecord
from loragate.gateway.errors import NotFoundError
from loragate.gateway.openai.schemas import ModelCard, ModelList
from loragate.gateway.serving.served_model import ServedModel
from loragate.gateway.tenancy.principal import Caller


class ModelsController(Controller):
    path = "/v1/models"
    tags = ["OpenAI"]

    @get("/", summary="List models and adapters")
    async def list_models(
        self,
        caller: Caller,
        served_model: NamedDependency[ServedModel],
        catalog: NamedDependency[AdapterCatalog],
    ) -> ModelList:
        adapters = await catalog.list(caller)
        cards = [_adapter_card(served_model, caller.name_of(r), r) for r in adapters]
        return ModelList(data=[_base_card(served_model)] + cards)

    @get("/{tenant:str}/{name:str}", summary="Admin: describe a tenant's adapter")
    async def get_tenant_model(
        self,
        tenant: FromPath[str],
        name: FromPath[str],
        caller: Caller,
        served_model: NamedDependency[ServedModel],
        catalog: NamedDependency[AdapterCatalog],
    ) -> ModelCard:
        """The admin names a tenant's adapter `<tenant>/<name>`: two path segments."""
        return await self.get_model.fn(self, f"{tenant}/{name}", caller, served_model, catalog)

    @get("/{model_id:str}", summary="Describe one model or adapter")
    async def get_model(
        self,
        model_id: FromPath[str],
        caller: Caller,
        served_model: NamedDependency[ServedModel],
        catalog: NamedDependency[AdapterCatalog],
    ) -> ModelCard:
        if model_id == served_model.model_name:
            return _base_card(served_model)
        record = await catalog.visible(caller, model_id)
        if record is None:
            raise NotFoundError(
                f"the model {model_id!r} does not exist", param="model", code="model_not_found"
            )
        return _adapter_card(served_model, caller.name_of(record), record)


def _base_card(served_model: ServedModel) -> ModelCard:
    name = served_model.model_name
    return ModelCard(
        id=name,
        created=served_model.started_at,
        root=name,
        max_model_len=served_model.max_model_len,
    )


def _adapter_card(served_model: ServedModel, name: str, record: AdapterRecord) -> ModelCard:
    # `root` is the adapter's name as the caller uses it: file paths are never shown here.
    return ModelCard(
        id=name,
        created=record.created,
        root=name,
        parent=served_model.model_name,
        max_model_len=served_model.max_model_len,
    )
