"""Which waiting sequence is admitted next: the policy plugin's order, in front of the
prefill order, behind the adapter-slot bound.

The engine first puts waiting prompts in its prefill order (arrival for `fcfs` and
`priority`; shortest prefill first, with its age bound, for `shortest_prefill` and `fair`),
then asks the `loragate_order_waiting` hook (plain data: one entry per sequence, and the
active tenants' service counters) for the admission order. A sequence that has waited
`max_slot_wait_steps` steps for an adapter slot goes before all of it: while it waits, no
later request may take a slot, so the busy slots drain between requests and it gets one,
whatever the policy. A plugin that answers badly is logged and its answer ignored for that
step: scheduling goes on in the prefill order.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from loragate.engine.core.fair_share import PROMPT_TOKEN_COST, FairShare, fair_share_key
from loragate.engine.core.prefill_order import prefill_order
from loragate.engine.core.sequence import Sequence
from loragate.plugins import PluginError

log = logging.getLogger(__name__)

ARRIVAL_ORDER_POLICIES = ("fcfs", "priority")
# Steps a request may wait for an adapter slot before it goes first (at ~0.5 s a step on
# the development machine, about half a minute).
MAX_SLOT_WAIT_STEPS = 64


def waiting_entries(
    seqs: list[Sequence], prompt_token_cost: float = PROMPT_TOKEN_COST
) -> list[dict]:
    """Waiting sequences as the plain data the order hook takes."""
    return [
        {
            "seq_id": seq.seq_id,
            "request_id": seq.request.request_id,
            "tenant": fair_share_key(seq.request),
            "priority": seq.request.priority,
            "arrival_time": seq.request.arrival_time,
            "num_new_tokens": seq.num_uncomputed_tokens,
            "cost": seq.num_uncomputed_tokens * prompt_token_cost,
            "resumed": seq.num_tokens > seq.prompt_len,
            "lora_name": seq.lora_request.lora_name if seq.lora_request else None,
        }
        for seq in seqs
    ]


class AdmissionOrder:
    """The scheduler's `order(waiting)`: one policy, the hook that answers it, the counters."""

    def __init__(
        self,
        policy: str,
        order_hook: Callable[[list[dict], dict, str], list[int]] | None = None,
        fair_share: FairShare | None = None,
        max_slot_wait_steps: int = MAX_SLOT_WAIT_STEPS,
    ):
        self.policy = policy
        self.order_hook = order_hook
        self.fair_share = fair_share or FairShare()
        self.max_slot_wait_steps = max_slot_wait_steps

    def __call__(self, waiting: list[Sequence]) -> list[Sequence]:
        base = "fcfs" if self.policy in ARRIVAL_ORDER_POLICIES else "shortest_prefill"
        order = prefill_order(waiting, base, time.monotonic())
        if self.order_hook is not None:
            order = self._ask_plugins(order)
        starved = [s for s in order if s.slot_wait_steps >= self.max_slot_wait_steps]
        if starved:
            starved.sort(key=lambda s: -s.slot_wait_steps)
            order = starved + [s for s in order if s.slot_wait_steps < self.max_slot_wait_steps]
        return order

    def _ask_plugins(self, order: list[Sequence]) -> list[Sequence]:
        try:
            tenants = self.fair_share.tenants()
            entries = waiting_entries(order, self.fair_share.prompt_token_cost)
            seq_ids = self.order_hook(entries, tenants, self.policy)
        except PluginError as exc:
            log.error("admission order ignored for this step: %s", exc)
            return order
        by_id = {seq.seq_id: seq for seq in order}
        return [by_id[i] for i in seq_ids]
