"""In which order waiting prompts are admitted: the order that serves time to first token.

`shortest_prefill`: sequences that ran before (preempted, now recomputing) first, then
prompts that have waited `max_wait_s` or more (oldest first), then the rest, shortest
remaining prefill first. Shortest first lowers mean TTFT the way shortest-job-first lowers
mean waiting time; the age bound means no prompt waits behind shorter ones forever.
`fcfs`: arrival order, as vLLM's default policy. A fairness policy between tenants decides
which requests may go; this only orders what it lets through.
"""

from __future__ import annotations

from collections.abc import Iterable

from loragate.engine.core.sequence import Sequence

POLICIES = ("shortest_prefill", "fcfs")
MAX_WAIT_S = 10.0  # a prompt waiting this long goes before shorter ones


def prefill_order(
    waiting: Iterable[Sequence], policy: str, now: float, max_wait_s: float = MAX_WAIT_S
) -> list[Sequence]:
    """The waiting sequences in the order they should be admitted."""
    if policy == "fcfs":
        return list(waiting)

    def key(seq: Sequence):
        resumed = seq.num_tokens > seq.prompt_len  # it had started decoding when preempted
        waited = now - seq.request.arrival_time
        aged = waited >= max_wait_s
        length = 0 if aged else seq.num_uncomputed_tokens
        return (not resumed, not aged, length, -waited, seq.seq_id)

    return sorted(waiting, key=key)
