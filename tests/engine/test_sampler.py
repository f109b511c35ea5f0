"""Sampler: each pure tensor step against a reference (the batch Sampler: test_batch_sampler)."""

from collections import Counter

import pytest
import torch

from loragate.engine.core.sequence import sample_generator
from loragate.engine.sampling import sampler as sampler_module
from loragate.engine.sampling.sampler import (
    apply_min_p,
    apply_penalties,
    apply_temperature,
    apply_top_k_top_p,
    draw_uniforms,
    sample,
    token_counts,
)

NEG_INF = float("-inf")


def random_logits(n, vocab, seed=0, scale=3.0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, vocab, generator=gen) * scale


# -- token_counts and penalties -------------------------------------------------------


def test_token_counts():
    counts = token_counts([[1, 1, 3], [], [0, 4, 4, 4]], vocab_size=5)
    assert counts.tolist() == [[0, 2, 0, 1, 0], [0] * 5, [1, 0, 0, 0, 3]]


@pytest.mark.parametrize("bad", [[[5]], [[0, -1]]])
def test_token_counts_rejects_ids_outside_the_vocabulary(bad):
    with pytest.raises(ValueError, match="outside the vocabulary"):
        token_counts(bad, vocab_size=5)


def reference_penalties(logits, prompts, outputs, presence, frequency, repetition):
    """vLLM's rules written out token by token, in float64."""
    out = logits.double().clone()
    for row in range(out.shape[0]):
        counts = Counter(outputs[row])
        seen = set(prompts[row]) | set(outputs[row])
        for token in range(out.shape[1]):
            value = out[row, token].item()
            if token in seen:
                rep = repetition[row]
                value = value / rep if value > 0 else value * rep
            value -= frequency[row] * counts[token]
            value -= presence[row] * (1.0 if counts[token] else 0.0)
            out[row, token] = value
    return out


def test_penalties_match_the_reference():
    vocab = 40
    logits = random_logits(4, vocab)
    prompts = [[1, 2, 3, 3], [], [5, 6, 7, 30], [0, 39]]
    outputs = [[3, 4, 4, 4, 9], [1, 1, 2], [], [39, 39, 0, 12]]
    presence = [0.5, -0.7, 1.5, 0.0]
    frequency = [0.25, 0.1, -1.0, 2.0]
    repetition = [1.3, 0.7, 2.0, 1.0]
    got = apply_penalties(
        logits,
        token_counts(prompts, vocab) > 0,
        token_counts(outputs, vocab),
        torch.tensor(presence),
        torch.tensor(frequency),
        torch.tensor(repetition),
    )
    want = reference_penalties(logits, prompts, outputs, presence, frequency, repetition)
    torch.testing.assert_close(got.double(), want, rtol=1e-6, atol=1e-6)
    assert not torch.equal(got, logits)


def test_penalties_leave_unseen_tokens_and_the_input_alone():
    logits = random_logits(1, 10)
    before = logits.clone()
    got = apply_penalties(
        logits,
        token_counts([[2]], 10) > 0,
        token_counts([[7, 7]], 10),
        torch.tensor([1.0]),
        torch.tensor([1.0]),
        torch.tensor([1.5]),
    )
    assert torch.equal(logits, before)
    untouched = [t for t in range(10) if t not in (2, 7)]
    assert torch.equal(got[0, untouched], logits[0, untouched])
    assert got[0, 7] == pytest.approx(
        (logits[0, 7] / 1.5 if logits[0, 7] > 0 else logits[0, 7] * 1.5) - 2.0 - 1.0
    )


# -- temperature, min-p, top-k, top-p -------------------------------------------------


def test_temperature_divides_each_row():
    logits = random_logits(3, 7)
    got = apply_temperature(logits, torch.tensor([0.5, 1.0, 2.0]))
    torch.testing.assert_close(got, logits / torch.tensor([[0.5], [1.0], [2.0]]))


def test_min_p_matches_the_probability_rule():
    logits = random_logits(5, 300, seed=1)
    min_p = torch.tensor([0.0, 0.01, 0.1, 0.5, 1.0])
    got = apply_min_p(logits, min_p)
    probs = torch.softmax(logits.double(), dim=-1)
    dropped = probs < min_p.double().unsqueeze(1) * probs.max(dim=-1, keepdim=True).values
    assert torch.equal(torch.isinf(got), dropped)
    assert torch.equal(got[~dropped], logits[~dropped])
    assert not dropped[0].any() and dropped[4].sum() == 299


def test_top_k_keeps_exactly_the_k_best():
    vocab = 50
    logits = random_logits(5, vocab, seed=2)
    top_k = torch.tensor([1, 5, 0, -1, 50])
    got = apply_top_k_top_p(logits, top_k, torch.ones(5))
    for row, k in enumerate([1, 5, vocab, vocab, vocab]):
        kept = torch.isfinite(got[row]).nonzero().squeeze(1)
        best = logits[row].topk(k).indices
        assert set(kept.tolist()) == set(best.tolist())
        assert torch.equal(got[row, kept], logits[row, kept])


def reference_top_k_top_p(logits, top_k, top_p):
    """vLLM's sort-based masks in float64: top-k by value, then top-p on the survivors."""
    out = logits.double().clone()
    vocab = out.shape[1]
    for row in range(out.shape[0]):
        k = top_k[row] if 0 < top_k[row] < vocab else vocab
        kth = out[row].sort(descending=True).values[k - 1]
        out[row, out[row] < kth] = NEG_INF
        if top_p[row] < 1.0:
            values, order = out[row].sort()  # ascending
            mass = torch.softmax(values, dim=-1).cumsum(dim=-1)
            drop = mass <= 1.0 - top_p[row]
            drop[-1] = False
            out[row, order[drop]] = NEG_INF
    return out


@pytest.mark.parametrize(
    "vocab, scale, top_k, top_p",
    [
        (200, 3.0, [0, 0, 0, 0], [0.1, 0.5, 0.9, 0.99]),
        (200, 3.0, [10, 3, 40, 1], [0.5, 0.9, 0.8, 0.3]),
        (200, 3.0, [0, 7, -1, 0], [1.0, 1.0, 0.6, 0.95]),
        # Nearly flat rows: the nucleus is far wider than the first top-p window.
        (3000, 0.05, [0, 0, 0, 2500], [0.5, 0.9, 0.999, 0.9]),
    ],
)
def test_top_k_top_p_match_the_sorting_reference(vocab, scale, top_k, top_p):
    logits = random_logits(4, vocab, seed=vocab, scale=scale)
    got = apply_top_k_top_p(logits, torch.tensor(top_k), torch.tensor(top_p))
    want = reference_top_k_top_p(logits, top_k, top_p)
    assert torch.equal(torch.isinf(got), torch.isinf(want))
    finite = torch.isfinite(got)
    assert torch.equal(got[finite], logits[finite])
    assert (finite.sum(dim=-1) >= 1).all()


def test_wide_nucleus_needs_a_larger_window():
    # The window must grow for this row, or the check above would be vacuous.
    assert sampler_module.TOP_P_INITIAL_WINDOW < 1000
    logits = random_logits(1, 3000, scale=0.05)
    got = apply_top_k_top_p(logits, torch.tensor([0]), torch.tensor([0.9]))
    assert torch.isfinite(got).sum() > sampler_module.TOP_P_INITIAL_WINDOW * 8


def test_top_p_keeps_the_best_token_even_when_it_alone_exceeds_p():
    logits = torch.tensor([[10.0, 0.0, 0.0, 0.0]])
    got = apply_top_k_top_p(logits, torch.tensor([0]), torch.tensor([0.5]))
    assert torch.isfinite(got).tolist() == [[True, False, False, False]]


# -- drawing ----------------------------------------------------------------------------


def test_sample_never_picks_a_zero_probability_token():
    probs = torch.tensor([[0.0, 0.5, 0.0, 0.5, 0.0]]).repeat(500, 1)
    gen = torch.Generator().manual_seed(0)
    chosen = sample(probs, [gen] * 500)
    assert set(chosen.tolist()) == {1, 3}


def test_sample_follows_the_distribution():
    weights = torch.tensor([1.0, 2.0, 3.0, 4.0, 0.0])  # unnormalised is fine
    rows = 20000
    gen = torch.Generator().manual_seed(0)
    chosen = sample(weights.repeat(rows, 1), [gen] * rows)
    freq = torch.bincount(chosen, minlength=5).double() / rows
    torch.testing.assert_close(freq, weights.double() / 10, atol=0.015, rtol=0)


def test_sample_uses_each_rows_generator():
    probs = torch.softmax(random_logits(3, 1000), dim=-1)
    first = sample(probs, [sample_generator(s, 0) for s in (1, 2, 3)])
    again = sample(probs, [sample_generator(s, 0) for s in (1, 2, 3)])
    assert torch.equal(first, again)
    alone = sample(probs[1:2], [sample_generator(2, 0)])
    assert alone.item() == first[1].item()


def test_sample_checks_its_arguments():
    with pytest.raises(ValueError, match="generators"):
        sample(torch.ones(2, 3), [torch.Generator()])


def test_rows_sharing_a_generator_draw_in_row_order():
    shared = torch.Generator().manual_seed(5)
    own = torch.Generator().manual_seed(9)
    got = draw_uniforms([shared, own, shared], torch.device("cpu"))
    want_shared = torch.rand(2, generator=torch.Generator().manual_seed(5))
    want_own = torch.rand(1, generator=torch.Generator().manual_seed(9))
    assert got.tolist() == [want_shared[0].item(), want_own[0].item(), want_shared[1].item()]
