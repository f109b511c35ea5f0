"""Verifying proposals: the target samples each position; a proposal is accepted while it
equals the target's own sample.

A row that proposed d1..dk ran k+1 positions in the step's one forward pass (its last token
and the proposal), with its own adapter. Round j samples position j of every row still
accepting, exactly as a step without speculation would sample that row after d1..dj: the
same logits processors, grammar mask, penalties, min_tokens, temperature, top-k/top-p and
seeded generator, with the row's history extended by the tokens accepted so far. The row
keeps going while the sample equals d(j+1); the first sample that differs (or the one after
dk, the bonus) is its last token of the step.

This is rejection sampling for a proposer whose proposal is a point mass (prompt lookup,
and any deterministic proposer): d is accepted with probability p(d), and when it is not,
the token drawn is distributed as p restricted to the other tokens and renormalised, the
residual distribution. So every emitted token has the target's distribution, and since one
uniform is drawn per emitted token, as without speculation, a seeded request yields the
same tokens with speculation as without it. Greedy rows accept the longest prefix that
matches the target's argmax.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq

import torch

from loragate.engine.core.sequence import Sequence


class DraftedHistory:
    """A row's tokens as a round sees them: its own, then the proposal tokens accepted."""

    def __init__(self, seq: Sequence, accepted: Seq[int]):
        self.seq = seq
        self.accepted = accepted

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.seq.prompt_token_ids

    @property
    def output_token_ids(self) -> list[int]:
        return self.seq.output_token_ids + list(self.accepted)


def verify_drafts(
    sample, seqs: list[Sequence], drafts: list[list[int]], logits: torch.Tensor
) -> list:
    """Per row, the SampleResults of the tokens it takes (accepted proposal tokens, then
    one more), or the exception that failed it. `logits` holds each row's k+1 positions
    in row order; `sample(seqs, logits, histories)` is the step's sampling (its dispatcher).
    """
    starts, total = [], 0
    for draft in drafts:
        starts.append(total)
        total += len(draft) + 1
    if logits.shape[0] != total:
        raise ValueError(f"verification needs {total} logits rows, got {logits.shape[0]}")
    results: list = [[] for _ in seqs]
    live = list(range(len(seqs)))
    position = 0
    while live:
        histories = [DraftedHistory(seqs[i], drafts[i][:position]) for i in live]
        index = torch.tensor([starts[i] + position for i in live], device=logits.device)
        samples = sample([seqs[i] for i in live], logits.index_select(0, index), histories)
        still = []
        for i, result in zip(live, samples, strict=True):
            if isinstance(result, Exception):
                results[i] = result
                continue
            results[i].append(result)
            if position < len(drafts[i]) and result.token_id == drafts[i][position]:
                still.append(i)
        live = still
        position += 1
    return results
