"""Top-p thresholds found by value buckets (engine/sampling/wide_nucleus.py) against the sorting
loop they replace for wide nuclei: the same thresholds to the bit, so the same tokens kept
and, for the same seeds, the same tokens drawn; rows it cannot prove go to the loop."""

from __future__ import annotations

import pytest
import torch

import loragate.engine.sampling.sampler as sampler_module
from loragate.engine import SamplingParams
from loragate.engine.sampling.sampler import Sampler, SamplingRow, top_k_top_p_thresholds
from loragate.engine.sampling.wide_nucleus import EXACT_SUMMAND, wide_nucleus_thresholds


def declined(logits, norm, top_p):
    """Declines every row: the sorting loop alone decides, as before the buckets."""
    n = logits.shape[0]
    return torch.zeros(n, dtype=logits.dtype), torch.zeros(n, dtype=torch.bool)


def rows_of(vocab: int, scale: float, n: int, seed: int, ties: bool, masked: bool):
    logits = torch.randn(n, vocab, generator=torch.Generator().manual_seed(seed)) * scale
    if ties:  # a few hundred distinct values: ties across the nucleus's edge
        logits = (logits * 64 / scale).round() * (scale / 64)
    if masked:  # min_p (or a grammar) has dropped part of each row
        logits[:, ::3] = float("-inf")
    return logits


@pytest.mark.parametrize("vocab", [3000, 49152])
@pytest.mark.parametrize("scale", [0.01, 0.3, 1.0, 3.0])
@pytest.mark.parametrize("ties, masked", [(False, False), (True, False), (False, True)])
def test_bucket_thresholds_equal_the_sorting_loops(monkeypatch, vocab, scale, ties, masked):
    n = 8 if vocab > 10000 else 40
    logits = rows_of(vocab, scale, n, seed=vocab + int(scale * 100), ties=ties, masked=masked)
    top_p = torch.tensor([0.3, 0.5, 0.8, 0.9, 0.95, 0.99, 0.999, 0.9999] * (n // 8))
    top_k = torch.zeros(n, dtype=torch.long)
    got = top_k_top_p_thresholds(logits, top_k, top_p)
    monkeypatch.setattr(sampler_module, "wide_nucleus_thresholds", declined)
    want = top_k_top_p_thresholds(logits, top_k, top_p)
    assert torch.equal(got, want)
    # The buckets did decide the rows whose nucleus is wider than the first window, but for
    # top_p=0.9999 where the mass summed may reach 1 (those may go to the loop).
    norm = torch.logsumexp(logits, dim=-1)
    found, decided = wide_nucleus_thresholds(logits, norm, top_p)
    wide = (logits >= want.unsqueeze(1)).sum(dim=1) > sampler_module.TOP_P_INITIAL_WINDOW
    assert wide.sum() >= n // 4
    assert decided[wide & (top_p < 0.9999)].all()
    assert torch.equal(found[decided], want[decided])


def test_seeded_tokens_on_flat_rows_are_the_sorting_loops(monkeypatch):
    vocab, n = 49152, 16
    logits = rows_of(vocab, 0.5, n, seed=3, ties=False, masked=False)
    params = SamplingParams(temperature=0.9, top_p=0.95, seed=7)

    def sampled():
        rows = [SamplingRow(params, [1], [], torch.Generator().manual_seed(i)) for i in range(n)]
        return [r.token_id for r in Sampler(vocab, {0}, torch.Generator())(logits, rows)]

    got = sampled()
    monkeypatch.setattr(sampler_module, "wide_nucleus_thresholds", declined)
    assert got == sampled()


def test_a_nucleus_edge_among_tiny_probabilities_is_left_to_the_loop(monkeypatch):
    # One token holds all but ~2e-5 of the mass, spread over 49151 tokens of p < 2**-30: the
    # edge of a 0.99999 nucleus lies among them, where float32 sums need not be exact.
    vocab = 49152
    logits = torch.full((1, vocab), -21.5)
    logits[0, 0] = 0.0
    norm = torch.logsumexp(logits, dim=-1)
    assert torch.exp(logits[0, 1] - norm).item() < EXACT_SUMMAND
    top_p = torch.tensor([0.99999])
    _, decided = wide_nucleus_thresholds(logits, norm, top_p)
    assert not decided.any()
    got = top_k_top_p_thresholds(logits, torch.zeros(1, dtype=torch.long), top_p)
    monkeypatch.setattr(sampler_module, "wide_nucleus_thresholds", declined)
    assert torch.equal(got, top_k_top_p_thresholds(logits, torch.zeros(1), top_p))
    assert got.item() == -21.5


def test_rows_with_nan_are_declined():
    logits = torch.randn(2, 500) * 0.1
    logits[1, 7] = float("nan")
    _, decided = wide_nucleus_thresholds(
        logits, torch.logsumexp(logits, dim=-1), torch.tensor([0.9, 0.9])
    )
    assert decided.tolist() == [True, False]
