"""Built-in admission orders that need no tenants: arrival (`fcfs`), shortest prefill first
(`shortest_prefill`, whose order the engine already gives) and vLLM's `priority`.

Each works on the plain waiting entries the engine builds (seq_id, request_id, tenant,
priority, arrival_time, num_new_tokens, cost, resumed, lora_name), listed in the engine's
own order: arrival for `fcfs` and `priority`, shortest prefill first (with its age bound)
otherwise. Within one priority, tenants share fairly (the fair policy's VTC order).
"""

from __future__ import annotations

from loragate.plugins.builtin.fair_share import vtc_order
from loragate.plugins.markers import hookimpl

GIVEN_ORDER_POLICIES = ("fcfs", "shortest_prefill")


def priority_order(waiting: list[dict], tenants: dict | None = None) -> list[int]:
    """vLLM's priority policy: lower ``priority`` first; within one priority the tenants'
    fair shares (VTC's order: the least-served tenant's head first), and within a tenant
    the order given (arrival). With one tenant, exactly vLLM's (priority, arrival)."""
    levels: dict[int, list[dict]] = {}
    for entry in waiting:
        levels.setdefault(entry["priority"], []).append(entry)
    order: list[int] = []
    for priority in sorted(levels):
        order += vtc_order(levels[priority], tenants or {})
    return order


class WaitingOrder:
    """Registered last: any plugin's admission order is asked first."""

    @hookimpl(trylast=True)
    def loragate_order_waiting(self, waiting, tenants, policy):
        if policy in GIVEN_ORDER_POLICIES:
            return [entry["seq_id"] for entry in waiting]
        if policy == "priority":
            return priority_order(waiting, tenants)
        return None
