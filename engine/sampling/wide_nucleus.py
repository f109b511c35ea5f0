"""Top-p thresholds of wide nuclei without sorting the vocabulary (CPU).

A flat row's nucleus holds most of the vocabulary (top_p=0.95 over a random model's 49152
logits: ~45000 tokens), so finding its last token by sorting costs a sort of the whole row
(~3.5 ms a row on one core). Here each row's values are cut into value buckets; the bucket
masses (one scatter_add) locate the bucket where the mass of the tokens ranked above
reaches top_p, and only that bucket (a few hundred tokens) is sorted and summed token by
token from the mass of the buckets above it.

The threshold is exactly the one the sorting loop (sampler.top_k_top_p_thresholds) finds.
That loop sums the sorted float32 probabilities in double, in order, and rounds each prefix
to float32 before comparing it with top_p. Every float32 of at least 2**-30 is a multiple of
2**-53, so while each sum stays below 1 every double addition is exact, whatever the order:
the bucket sums here and the loop's running sums are then the same numbers. A row where
that cannot be shown (a bucket holding a probability below 2**-30, a sum reaching 1, a top_p
the whole row's mass does not reach, a NaN) is declined and left to the sorting loop.
"""

from __future__ import annotations

import torch

NUM_BUCKETS = 1024
EXACT_SUMMAND = 2.0**-30  # the smallest float32 that is a multiple of 2**-53


def wide_nucleus_thresholds(
    logits: torch.Tensor, norm: torch.Tensor, top_p: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row of float32 ``logits`` (with ``norm`` its logsumexp, ``top_p`` < 1): the
    smallest logit top-p keeps, and whether the row was decided here (False: declined)."""
    n = logits.shape[0]
    probs = torch.exp(logits - norm.unsqueeze(1))
    finite = torch.isfinite(logits)
    low = logits.masked_fill(~finite, float("inf")).amin(dim=-1, keepdim=True)
    high = logits.amax(dim=-1, keepdim=True)
    width = high - low
    scale = torch.where(width > 0, NUM_BUCKETS / width, torch.zeros_like(width))
    # Monotone in the logit (each step rounds monotonically): ties share a bucket, and
    # -inf (0 * -inf: NaN when the row is flat) falls in the lowest.
    position = ((logits - low) * scale).nan_to_num(0.0, posinf=0.0, neginf=0.0)
    buckets = position.clamp_(0, NUM_BUCKETS - 1).long()
    mass = torch.zeros(n, NUM_BUCKETS, dtype=torch.float64).scatter_add_(1, buckets, probs.double())
    # From the highest bucket down: the mass of the buckets above each, and through it.
    through = mass.flip(1).cumsum(dim=1)
    above = torch.cat([torch.zeros_like(through[:, :1]), through[:, :-1]], dim=1)
    p = top_p.to(torch.float32).unsqueeze(1)
    reached = through.float() >= p
    found = reached.any(dim=1)
    rank = reached.int().argmax(dim=1)  # the first bucket from the top that reaches p
    bucket = NUM_BUCKETS - 1 - rank
    start = above.gather(1, rank.unsqueeze(1))
    # The bucket's tokens, best first; padding (-inf) sits past each row's own count.
    members = buckets == bucket.unsqueeze(1)
    count = members.sum(dim=1)
    width_needed = max(int(count.max()), 1)
    values = logits.masked_fill(~members, float("-inf")).topk(width_needed, dim=-1).values
    real = torch.arange(width_needed).unsqueeze(0) < count.unsqueeze(1)
    member_probs = torch.exp(values - norm.unsqueeze(1))
    sums = torch.cat([start, member_probs.double()], dim=1).cumsum(dim=1)
    # sums[:, i]: the mass ranked above member i; a member stays while it is below p.
    keep = real & (sums[:, :-1].float() < p)
    last = keep.sum(dim=1).clamp(min=1) - 1
    thresholds = values.gather(1, last.unsqueeze(1)).squeeze(1)
    smallest = member_probs.masked_fill(~real, 1.0).amin(dim=1)
    total = through.gather(1, rank.unsqueeze(1)).squeeze(1)
    decided = (
        found
        & (count > 0)
        & (smallest >= EXACT_SUMMAND)
        & (total < 1.0)
        & ~torch.isnan(logits).any(dim=1)
        & torch.isfinite(norm)
    )
    return thresholds, decided
