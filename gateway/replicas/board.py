"""The replicas' notice board: a small Ray actor each replica reports its state to, and
where the ingress posts adapters to retire.

Ray Serve routes a call to one replica of its choosing and has no broadcast; the board is
how the ingress sees every replica (GET /v1/replicas, /metrics) and reaches all of them
(retiring an adapter). A replica that stops reporting (its actor died) drops off after
`stale_after_s`.
"""

from __future__ import annotations

import time

from loragate.adapters import LoRARequest
from loragate.gateway.replicas.wire import ReplicaReport


class ReplicaBoard:
    def __init__(self, stale_after_s: float = 3.0):
        self.stale_after_s = stale_after_s
        self._reports: dict[str, ReplicaReport] = {}
        self._retired: list[LoRARequest] = []

    def report(self, report: ReplicaReport) -> list[LoRARequest]:
        """Record a replica's state; answer the adapters retired since it last asked."""
        previous = self._reports.get(report.replica)
        seen = len(self._retired) if previous is None else previous.retired_seen  # new: holds none
        report.retired_seen = len(self._retired)
        self._reports[report.replica] = report
        return self._retired[seen:]

    def forget(self, replica: str) -> None:
        """A replica that shuts down says so, rather than waiting to go stale."""
        self._reports.pop(replica, None)

    def retire(self, lora: LoRARequest) -> None:
        self._retired.append(lora)

    def reports(self) -> list[ReplicaReport]:
        """The live replicas' latest reports, oldest replica id first."""
        now = time.time()
        live = [r for r in self._reports.values() if now - r.reported_at <= self.stale_after_s]
        return sorted(live, key=lambda r: r.replica)
