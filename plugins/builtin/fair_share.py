"""Built-in fair admission between tenants: the Virtual Token Counter (VTC, "Fairness in
Serving Large Language Models", OSDI 2024), policy `fair`.

The next request admitted is the head of the tenant with the least virtual service;
admitting it adds its prompt's cost (divided by the tenant's weight) to that tenant's
counter, so one step's admissions alternate between tenants as their counters pass each
other. Within one tenant the engine's order stands (shortest prefill first, with its age
bound). Ties go to the tenant whose head came first in that order.
"""

from __future__ import annotations

import heapq

from loragate.plugins.markers import hookimpl


def vtc_order(waiting: list[dict], tenants: dict[str, dict]) -> list[int]:
    """The seq_ids of ``waiting`` with the least-served tenant's head first each time."""
    queues: dict[str, list[tuple[int, dict]]] = {}
    for position, entry in enumerate(waiting):
        queues.setdefault(entry["tenant"], []).append((position, entry))
    heap = []
    for tenant, queue in queues.items():
        service = tenants.get(tenant, {}).get("service", 0.0)
        heap.append((service, queue[0][0], tenant, 0))
    heapq.heapify(heap)
    order = []
    while heap:
        service, _, tenant, index = heapq.heappop(heap)
        _, entry = queues[tenant][index]
        order.append(entry["seq_id"])
        weight = tenants.get(tenant, {}).get("weight", 1.0)
        if index + 1 < len(queues[tenant]):
            head = queues[tenant][index + 1][0]
            heapq.heappush(heap, (service + entry["cost"] / weight, head, tenant, index + 1))
    return order


class VirtualTokenCounter:
    """Registered last: any plugin's admission order is asked first."""

    @hookimpl(trylast=True)
    def loragate_order_waiting(self, waiting, tenants, policy):
        return vtc_order(waiting, tenants) if policy == "fair" else None
