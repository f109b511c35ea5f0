"""Adapter affinity that does not hot-spot: Ray Serve's routing plus a spill rule.

Ray Serve's multiplexed routing sends every request for an adapter to the replicas that
hold it (power of two choices among them), so one popular adapter piles onto one replica
while others idle (llm-d's issue 709 describes the same). The spill rule: when every
replica holding the request's adapter has at least `spill_at` requests in flight and some
other replica has at most `idle_at`, the request goes to the least loaded of those, which
loads the adapter too; from then on Ray Serve routes the adapter to both. Otherwise the
request is routed exactly as Ray Serve's default router routes it.

Requests in flight per replica are counted here, from what this router sent and saw
finish (and corrected by the replicas' own counts whenever they report one), so the rule
costs no probe. `loragate serve --spill-at N` turns it on (`--spill-idle-at`, default 1).
"""

from __future__ import annotations

from collections import Counter

# Ray Serve's default router, under the name its own RequestRouterConfig defaults to.
from ray.serve._private.request_router import PowerOfTwoChoicesRequestRouter
from ray.serve.request_router import PendingRequest, ReplicaID, RunningReplica


class SpillRouter(PowerOfTwoChoicesRequestRouter):
    def initialize_state(self, spill_at: int = 4, idle_at: int = 1, **kwargs) -> None:
        super().initialize_state(**kwargs)
        self.spill_at = spill_at
        self.idle_at = idle_at
        self.in_flight: Counter[ReplicaID] = Counter()
        self.spilled = 0

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        target = self.spill_target(pending_request)
        ranked = await super().choose_replicas(candidate_replicas, pending_request)
        if target is None:
            return ranked
        self.spilled += 1
        return [[self._replicas[target]], *ranked]

    def spill_target(self, pending_request: PendingRequest | None) -> ReplicaID | None:
        """The replica to spill the request to, or None to route it as Ray Serve does."""
        model = pending_request.metadata.multiplexed_model_id if pending_request else ""
        if not model:
            return None
        holders = self._multiplexed_model_id_to_replica_ids.get(model, set())
        holders = holders & self._replica_id_set
        if not holders or min(self.in_flight[r] for r in holders) < self.spill_at:
            return None
        idle = [r for r in self._replica_id_set - holders if self.in_flight[r] <= self.idle_at]
        if not idle:
            return None
        return min(idle, key=lambda r: (self.in_flight[r], r.unique_id))

    # The counts the rule reads: one per request sent, less one when it ends; a replica's
    # own count replaces them when it reports one.
    def on_send_request(self, replica_id: ReplicaID) -> None:
        super().on_send_request(replica_id)
        self.in_flight[replica_id] += 1

    def decrement_queue_len_cache(self, replica_id: ReplicaID) -> None:
        super().decrement_queue_len_cache(replica_id)
        self.in_flight[replica_id] = max(0, self.in_flight[replica_id] - 1)

    def on_new_queue_len_info(self, replica_id: ReplicaID, num_ongoing_requests: int) -> None:
        super().on_new_queue_len_info(replica_id, num_ongoing_requests)
        self.in_flight[replica_id] = num_ongoing_requests

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self.in_flight.pop(replica_id, None)
