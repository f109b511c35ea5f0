"""Built-in preemption: the newest admitted sequence group goes first (as in vLLM).

Preempting the newest loses the least finished work and keeps the oldest requests
(whose users have waited longest) running.
"""

from __future__ import annotations

from loragate.plugins.markers import hookimpl


def newest_first_victim(running: list[dict]):
    """The request_id of the group with the largest admitted_order (0 = oldest)."""
    if not running:
        raise ValueError("no running sequence groups to choose a preemption victim from")
    return max(running, key=lambda group: group["admitted_order"])["request_id"]


class NewestFirstPreemption:
    """Registered last: any plugin's preemption policy is asked first."""

    @hookimpl(trylast=True)
    def loragate_choose_preemption_victim(self, running):
        return newest_first_victim(running)
