"""Usage counts (prompt tokens, completion tokens, requests) per tenant and adapter.

They live in the registry store, so they add up across replicas and outlive a restart.
A count the store could not take (it is unreachable) waits here, summed per tenant and
adapter, and is written when the store answers again: nothing is lost or counted twice
(unless the store fails in the instant between running a write and answering it, when
the write cannot be told apart from one that never ran).
"""

from __future__ import annotations

import asyncio

from loragate.gateway.errors import RegistryDownError
from loragate.gateway.store_seam import StoreSeam
from loragate.registry import UsageCounts

_Key = tuple[str, str | None]  # (tenant, adapter name or None for the base model)


class UsageMeter:
    def __init__(self, store: StoreSeam):
        self._store = store
        self._health = store.health
        self._pending: dict[_Key, UsageCounts] = {}
        self._flushing = asyncio.Lock()

    @property
    def pending(self) -> int:
        """(tenant, adapter) counts waiting for the store."""
        return len(self._pending)

    async def record(self, tenant: str, adapter: str | None, counts: UsageCounts) -> None:
        if not self._health.down:
            try:
                await self._write((tenant, adapter), counts)
                return
            except RegistryDownError:
                pass
        self._hold((tenant, adapter), counts)

    async def flush(self) -> bool:
        """Write what waits (unless the store is known to be down); True when nothing waits."""
        if self._health.down:
            return not self._pending
        async with self._flushing:
            for key in list(self._pending):
                counts = self._pending.pop(key)
                try:
                    await self._write(key, counts)
                except RegistryDownError:
                    self._hold(key, counts)
                    return False
            return True

    async def _write(self, key: _Key, counts: UsageCounts) -> None:
        tenant, adapter = key
        await self._store.record_usage(
            tenant,
            adapter,
            prompt_tokens=counts.prompt_tokens,
            completion_tokens=counts.completion_tokens,
            requests=counts.requests,
        )

    def _hold(self, key: _Key, counts: UsageCounts) -> None:
        held = self._pending.get(key, UsageCounts())
        self._pending[key] = UsageCounts(
            held.prompt_tokens + counts.prompt_tokens,
            held.completion_tokens + counts.completion_tokens,
            held.requests + counts.requests,
        )
