"""Usage counts (prompt tokens, completion tokens, requests) per tenant and adapter.

They live in the registry store, so they add up across replicas and outlive a restart.
A count the store could not take (it is unreachable) waits here, summed per tenant and
adapter, and is written when the store answers again: nothing is lost or counted twice
(unless the store fails in the instant between running a write and answering it, when
the write cannot be told apart from one that never ran).

Writes are grouped: every count recorded while a write is in flight goes, summed per
tenant and adapter, into the next one (one transaction, one round trip), and each
`record` returns once the write that carries it is done. Streams count before each event
they send (serving/accounting.py), so a step's events across every stream cost about one
round trip to Redis, not one each.
"""

from __future__ import annotations

import asyncio
import logging

from loragate.gateway.errors import RegistryDownError
from loragate.gateway.registry_seam import RegistrySeam
from loragate.registry import UsageCounts
from loragate.registry.records import check_usage

log = logging.getLogger(__name__)

_Key = tuple[str, str | None]  # (tenant, adapter name or None for the base model)


class UsageMeter:
    def __init__(self, store: RegistrySeam):
        self._store = store
        self._health = store.health
        self._pending: dict[_Key, UsageCounts] = {}
        self._flushing = asyncio.Lock()
        self._batch: dict[_Key, UsageCounts] = {}
        self._batch_written: asyncio.Future | None = None
        self._writer: asyncio.Task | None = None

    @property
    def pending(self) -> int:
        """(tenant, adapter) counts waiting for the store."""
        return len(self._pending)

    async def record(self, tenant: str, adapter: str | None, counts: UsageCounts) -> None:
        """Returns once the counts are in the store, or held here while it is down. A bad
        count is a ValueError here, before it joins anyone's write."""
        check_usage(
            tenant, adapter, counts.prompt_tokens, counts.completion_tokens, counts.requests
        )
        key = (tenant, adapter)
        if self._health.down:
            _add(self._pending, key, counts)
            return
        _add(self._batch, key, counts)
        if self._batch_written is None:
            self._batch_written = asyncio.get_running_loop().create_future()
        written = self._batch_written
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._write_batches(), name="usage-writer")
        await asyncio.shield(written)

    async def _write_batches(self) -> None:
        """Write what gathered, then what gathered meanwhile, until nothing waits."""
        while self._batch:
            batch, written = self._batch, self._batch_written
            self._batch, self._batch_written = {}, None
            try:
                await self._write(batch)
            except RegistryDownError:
                self._hold(batch)
            except Exception:  # the counts must not be lost to a bug in a write
                log.exception("writing usage counts failed; holding them to retry")
                self._hold(batch)
            finally:
                if written is not None and not written.done():
                    written.set_result(None)

    async def flush(self) -> bool:
        """Write what waits (unless the store is known to be down); True when nothing waits."""
        if self._health.down:
            return not self._pending
        async with self._flushing:
            if not self._pending:
                return True
            held, self._pending = self._pending, {}
            try:
                await self._write(held)
            except RegistryDownError:
                self._hold(held)
                return False
            return True

    async def _write(self, counts: dict[_Key, UsageCounts]) -> None:
        await self._store.record_usages(
            [(tenant, adapter, c) for (tenant, adapter), c in counts.items()]
        )

    def _hold(self, counts: dict[_Key, UsageCounts]) -> None:
        for key, c in counts.items():
            _add(self._pending, key, c)


def _add(into: dict[_Key, UsageCounts], key: _Key, counts: UsageCounts) -> None:
    held = into.get(key, UsageCounts())
    into[key] = UsageCounts(
        held.prompt_tokens + counts.prompt_tokens,
        held.completion_tokens + counts.completion_tokens,
        held.requests + counts.requests,
    )
