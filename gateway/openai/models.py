"""GET /v1/models: the base model and the adapters the caller may name in `model`, paged."""

from __future__ import annotations

from litestar import Controller, get
from litestar.params import FromPath, FromQuery

from loragate.gateway.adapter_control.catalog import AdapterCatalog
from loragate.gateway.adapter_control.listing import list_page
from loragate.gateway.adapter_control.served_adapters import AdapterRecord
from loragate.gateway.errors import NotFoundError
from loragate.gateway.openai.schemas import BaseQuantization, ModelCard, ModelList
from loragate.gateway.serving.served_model import ServedModel
from loragate.gateway.tenancy.principal import Caller
from loragate.registry.adapter_index import MAX_PAGE_SIZE


class ModelsController(Controller):
    path = "/v1/models"
    tags = ["OpenAI"]

    @get("/", summary="List the base model and a page of adapters")
    async def list_models(
        self,
        caller: Caller,
        served_model: ServedModel,
        catalog: AdapterCatalog,
        limit: FromQuery[int] = MAX_PAGE_SIZE,
        after: FromQuery[str | None] = None,
    ) -> ModelList:
        """The base model (first page only), then up to `limit` (1-1000, all of them by
        default) adapters after the id `after`; ask again with after=`last_id` while
        `has_more`."""
        page = await list_page(catalog, caller, after, limit)
        cards = [_adapter_card(served_model, caller.name_of(r), r) for r in page.records]
        return ModelList(
            data=([_base_card(served_model)] if after is None else []) + cards,
            first_id=cards[0].id if cards else None,
            last_id=cards[-1].id if cards else None,
            has_more=page.has_more,
        )

    @get("/{tenant:str}/{name:str}", summary="Admin: describe a tenant's adapter")
    async def get_tenant_model(
        self,
        tenant: FromPath[str],
        name: FromPath[str],
        caller: Caller,
        served_model: ServedModel,
        catalog: AdapterCatalog,
    ) -> ModelCard:
        """The admin names a tenant's adapter `<tenant>/<name>`: two path segments."""
        return await self.get_model.fn(self, f"{tenant}/{name}", caller, served_model, catalog)

    @get("/{model_id:str}", summary="Describe one model or adapter")
    async def get_model(
        self,
        model_id: FromPath[str],
        caller: Caller,
        served_model: ServedModel,
        catalog: AdapterCatalog,
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
        quantization=BaseQuantization(
            method=served_model.info.quantization or "none",
            weight_bytes=dict(served_model.info.weight_bytes),
        ),
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
