"""GET /v1/replicas: each engine replica, its resident adapters, requests and KV usage.

It names every tenant's adapters, so under tenancy it needs the admin key; on an open
server anyone is the operator. A single-process server lists its one engine as "local".
"""

from __future__ import annotations

from litestar import Controller, get

from loragate.gateway.admin.guards import admin_only
from loragate.gateway.replicas.reports import ReplicaReports
from loragate.gateway.replicas.views import ReplicaList, replica_view

OPERATOR_ONLY = {"admin_only": "/v1/replicas shows the whole deployment and needs the admin key"}


class ReplicasController(Controller):
    path = "/v1/replicas"
    tags = ["Operations"]

    @get("/", summary="Engine replicas and what each holds", guards=[admin_only], opt=OPERATOR_ONLY)
    async def list_replicas(self, replicas: ReplicaReports) -> ReplicaList:
        reports = await replicas.reports()
        names_of = await replicas.adapter_names_by_weights()
        mode = "ray" if replicas.replicated else "single"
        return ReplicaList(data=[replica_view(r, names_of) for r in reports], mode=mode)
