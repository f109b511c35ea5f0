"""Pages of the adapters a caller may name, for `GET /v1/adapters` and `GET /v1/models`.

Pages come from the registry store's indexes (one read each, whatever the registry holds):
the operator's list is every adapter by key, a tenant's its own adapters and the public
ones its names do not hide, by name. The cursor is the last id of the page before (a key
for the operator, a name for a tenant), the way OpenAI's lists page: `after=<last_id>`
while `has_more`. An adapter this replica holds is shown as it serves it (`source`);
one it does not is shown from the store's record (`source` "registry"). While the store
is down, the page comes from what this replica holds.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from loragate.adapters import LoRARequest
from loragate.gateway.adapter_control.catalog import AdapterCatalog
from loragate.gateway.adapter_control.served_adapters import AdapterRecord
from loragate.gateway.errors import InvalidRequestError, RegistryDownError
from loragate.gateway.tenancy.principal import Principal
from loragate.registry import AdapterMetadata
from loragate.registry.adapter_index import MAX_PAGE_SIZE


@dataclass(frozen=True)
class ListedPage:
    records: list[AdapterRecord]
    has_more: bool


def check_page_params(after: str | None, limit: int) -> None:
    """400 for a limit outside 1..MAX_PAGE_SIZE or an empty cursor."""
    if not 1 <= limit <= MAX_PAGE_SIZE:
        raise InvalidRequestError(
            f"limit must be from 1 to {MAX_PAGE_SIZE}, got {limit}", param="limit"
        )
    if after is not None and not after:
        raise InvalidRequestError("after must be the last id of a page", param="after")


async def list_page(
    catalog: AdapterCatalog, caller: Principal, after: str | None, limit: int
) -> ListedPage:
    check_page_params(after, limit)
    if catalog.store is not None:
        try:
            if caller.is_operator:
                page = await catalog.store.page_adapters(after=after, limit=limit)
            else:
                page = await catalog.store.page_visible_adapters(
                    caller.tenant, after=after, limit=limit
                )
        except RegistryDownError:
            pass
        else:
            records = [await _as_listed(catalog, meta) for meta in page.data]
            return ListedPage(records, page.has_more)
    held = await catalog.list(caller)  # sorted by what the caller calls them
    ids = [caller.name_of(r) for r in held]
    start = 0 if after is None else bisect.bisect_right(ids, after)
    return ListedPage(held[start : start + limit], start + limit < len(held))


async def _as_listed(catalog: AdapterCatalog, meta: AdapterMetadata) -> AdapterRecord:
    held = await catalog.get(meta.key)
    if held is not None and held.lora_request.lora_int_id == meta.lora_int_id:
        return held
    return AdapterRecord(meta, LoRARequest(meta.key, meta.lora_int_id, meta.path), "registry")
