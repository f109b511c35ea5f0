"""The baseline router of benchmarks/replicas.py: plain round robin over the replicas, blind
to the adapter a request names (what a load balancer in front of N servers does)."""

from __future__ import annotations

from itertools import count

from ray.serve.request_router import PendingRequest, RequestRouter, RunningReplica


class RoundRobinRouter(RequestRouter):
    _turn = count()

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        ordered = sorted(candidate_replicas, key=lambda r: r.replica_id.unique_id)
        if not ordered:
            return []
        first = next(self._turn) % len(ordered)
        return [[ordered[first]], ordered[first + 1 :] + ordered[:first]]
