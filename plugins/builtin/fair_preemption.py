"""Built-in preemption for a waiting request when the batch is full, policies `fair` and
`priority` (with `fcfs` and `shortest_prefill` nothing is preempted for a waiting request).

`fair` (VTC's counters): the waiting request's tenant is owed service when another tenant
with sequences running has received more, by more than `FAIR_MARGIN` (weighted tokens, so
that two tenants whose counters cross do not trade places every step). The most
over-served such tenant gives up its newest running request.

`priority` (vLLM's field, lower first): a running request of a strictly lower priority (a
larger value) gives way to the waiting one, the lowest priority first, then the newest.

Either way a running entry marked `protected` (it started or resumed running only a few
steps ago) is never chosen: a sequence is not preempted twice within that many steps.
"""

from __future__ import annotations

from loragate.plugins.markers import hookimpl

# Weighted tokens (VTC's: a prompt token 1, a generated one 2) by which the most served
# running tenant must lead the waiting one before it gives up a request.
FAIR_MARGIN = 32.0


def fair_victim(waiting: dict, running: list[dict], tenants: dict) -> str | None:
    """The newest running request of the most over-served tenant, if one leads the waiting
    request's tenant by more than FAIR_MARGIN."""
    owed = tenants.get(waiting["tenant"], {}).get("service", 0.0)
    open_groups = [g for g in running if not g["protected"] and g["tenant"] != waiting["tenant"]]
    if not open_groups:
        return None

    def service(group: dict) -> float:
        return tenants.get(group["tenant"], {}).get("service", 0.0)

    richest = max(open_groups, key=lambda g: (service(g), g["admitted_order"]))
    if service(richest) - owed <= FAIR_MARGIN:
        return None
    same = [g for g in open_groups if g["tenant"] == richest["tenant"]]
    return max(same, key=lambda g: g["admitted_order"])["request_id"]


def priority_victim(waiting: dict, running: list[dict]) -> str | None:
    """The running request of the lowest priority below the waiting one's, newest first."""
    lower = [g for g in running if not g["protected"] and g["priority"] > waiting["priority"]]
    if not lower:
        return None
    return max(lower, key=lambda g: (g["priority"], g["admitted_order"]))["request_id"]


class FairPreemption:
    """Registered last: any plugin's answer is asked first."""

    @hookimpl(trylast=True)
    def loragate_preempt_for_waiting(self, waiting, running, tenants, policy):
        if policy == "fair":
            return fair_victim(waiting, running, tenants)
        if policy == "priority":
            return priority_victim(waiting, running)
        return None
