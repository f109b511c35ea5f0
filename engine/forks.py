"""Samples 2..n of a request (n > 1, best_of) fork from the sequence that computed the prompt.

They join the batch after the prompt's first step, sharing its KV blocks (reference counts,
copy-on-write), and take the same logits row for their first sample.
"""

from __future__ import annotations

from loragate.engine.sequence import Sequence


def fork_pending(sampled: list[Sequence], logits, block_manager, scheduler):
    """Samples 2..n of a request start here, sharing the prompt's KV blocks."""
    if not any(s.request.pending_forks for s in sampled):
        return sampled, logits
    rows, expanded = [], []
    for i, seq in enumerate(sampled):
        rows.append(i)
        expanded.append(seq)
        for child in seq.request.pending_forks:
            child.num_computed_tokens = seq.num_computed_tokens
            block_manager.fork(seq, child)
            scheduler.add_running(child, seq.lora_slot)
            rows.append(i)
            expanded.append(child)
        seq.request.pending_forks = []
    return expanded, logits[rows]
