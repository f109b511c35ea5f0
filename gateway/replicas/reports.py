"""Each engine replica's latest state (GET /v1/replicas, /metrics): the replicas' own reports
on Ray Serve, or the one local engine's."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from loragate.engine import EngineClient, EngineDeadError
from loragate.gateway.adapter_control.catalog import AdapterCatalog
from loragate.gateway.replicas.wire import ReplicaReport
from loragate.gateway.tenancy.principal import OPERATOR


class ReplicaReports:
    def __init__(
        self,
        engine: EngineClient,
        catalog: AdapterCatalog,
        replicated: bool,
        remote: Callable[[], Awaitable[list[ReplicaReport]]] | None = None,
    ):
        """`replicated`: the server runs engine replicas (--replicas); `remote`: their own
        reports (Ray Serve); None: this process's engine is the one."""
        self.engine = engine
        self.catalog = catalog
        self.replicated = replicated
        self.remote = remote

    async def reports(self) -> list[ReplicaReport]:
        """Each engine replica's latest state; the one local engine unless replicated."""
        if self.remote is not None:
            try:
                return await self.remote()
            except EngineDeadError:
                return []
        if not self.engine.is_running:
            return []
        try:
            stats = await self.engine.stats()
            return [ReplicaReport("local", "", stats, store_fetches=stats.adapter_store_fetches)]
        except EngineDeadError:
            return []

    async def adapter_names_by_weights(self) -> dict[str, list[str]]:
        """Weights sha256 -> the registered adapter keys with those weights."""
        names: dict[str, list[str]] = {}
        for record in await self.catalog.list(OPERATOR):
            names.setdefault(record.sha256, []).append(record.key)
        return names
