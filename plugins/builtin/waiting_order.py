"""Built-in admission orders that need no tenants: arrival (`fcfs`), shortest prefill first
(`shortest_prefill`, whose order the engine already gives) and vLLM's `priority`.

Each works on the plain waiting entries the engine builds (seq_id, request_id, tenant,
priority, arrival_time, num_new_tokens, cost, resumed, lora_name), listed in the engine's
own order: arrival for `fcfs` and `priority`, shortest prefill first (with its age bound)
otherwise.
"""

from __future__ import annotations

from loragate.plugins.markers import hookimpl

GIVEN_ORDER_POLICIES = ("fcfs", "shortest_prefill")


def priority_order(waiting: list[dict]) -> list[int]:
    """vLLM's priority policy: lower ``priority`` first, then the order given (arrival)."""
    return [entry["seq_id"] for entry in sorted(waiting, key=lambda e: e["priority"])]


class WaitingOrder:
    """Registered last: any plugin's admission order is asked first."""

    @hookimpl(trylast=True)
    def loragate_order_waiting(self, waiting, policy):
        if policy in GIVEN_ORDER_POLICIES:
            return [entry["seq_id"] for entry in waiting]
        if policy == "priority":
            return priority_order(waiting)
        return None
