"""The batch Sampler's contracts: greedy, penalties, logprobs, min_tokens, seeds, checks."""

import pytest
import torch
from test_sampler import random_logits, reference_top_k_top_p

from loragate.engine.core.sequence import sample_generator
from loragate.engine.sampling.sampler import Sampler, SampleResult, SamplingRow
from loragate.engine.sampling.sampling_params import SamplingParams

NEG_INF = float("-inf")


# -- the batch Sampler ------------------------------------------------------------------

VOCAB = 64
EOS = 2


def make_sampler(seed=0):
    return Sampler(VOCAB, {EOS}, torch.Generator().manual_seed(seed))


def row(params, prompt=(), output=(), generator=None):
    return SamplingRow(params, list(prompt), list(output), generator)


def test_greedy_takes_the_argmax_and_consumes_no_randomness():
    sampler = make_sampler()
    state = sampler.generator.get_state()
    logits = random_logits(20, VOCAB)
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=0.9, top_k=1)]
    results = sampler(logits, [row(params[i % 2]) for i in range(20)])
    assert [r.token_id for r in results] == logits.argmax(dim=-1).tolist()
    assert torch.equal(sampler.generator.get_state(), state)


def test_greedy_uses_the_penalised_logits():
    logits = torch.zeros(1, VOCAB)
    logits[0, 5], logits[0, 6], logits[0, 7] = 2.0, 1.5, 1.4
    sampler = make_sampler()
    repeated = SamplingParams(temperature=0.0, repetition_penalty=2.0)
    assert sampler(logits, [row(repeated, prompt=[5])])[0].token_id == 6
    present = SamplingParams(temperature=0.0, presence_penalty=1.0)
    # Presence applies to output tokens only: a prompt token keeps its logit.
    assert sampler(logits, [row(present, prompt=[5])])[0].token_id == 5
    assert sampler(logits, [row(present, output=[5, 6])])[0].token_id == 7


def test_logprobs_are_of_the_raw_logits():
    logits = random_logits(6, VOCAB)
    raw_logprobs = torch.log_softmax(logits, dim=-1)
    params = [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=0.7, logprobs=3, repetition_penalty=1.5),
        SamplingParams(temperature=1.3, top_p=0.8, logprobs=0),
        SamplingParams(temperature=0.0, logprobs=5, frequency_penalty=1.0),
        SamplingParams(temperature=1.0, top_k=4, min_p=0.1),
        SamplingParams(temperature=0.0, logprobs=VOCAB + 10),
    ]
    rows = [row(p, prompt=[1, 2, 3], output=[4, 4]) for p in params]
    results = make_sampler()(logits, rows)
    for i, result in enumerate(results):
        if params[i].logprobs is None:  # nothing asked: no softmax for this row (vLLM V1)
            assert result.logprob is None, i
            continue
        assert result.logprob == pytest.approx(raw_logprobs[i, result.token_id].item(), abs=1e-5)
    assert results[0].top_logprobs is None and results[4].top_logprobs is None
    assert results[2].top_logprobs == {results[2].token_id: results[2].logprob}
    for i, n in [(1, 3), (3, 5)]:
        top = raw_logprobs[i].topk(n)
        expected = dict(zip(top.indices.tolist(), top.values.tolist(), strict=True))
        got = results[i].top_logprobs
        assert results[i].token_id in got
        assert set(expected) <= set(got) and len(got) in (n, n + 1)
        for token, value in expected.items():
            assert got[token] == pytest.approx(value, abs=1e-5)
    assert len(results[5].top_logprobs) == VOCAB


def test_min_tokens_masks_eos_and_stop_tokens():
    logits = torch.zeros(1, VOCAB)
    logits[0, EOS], logits[0, 9], logits[0, 11] = 50.0, 40.0, 30.0
    sampler = make_sampler()
    for ignore_eos in (False, True):
        params = SamplingParams(
            temperature=0.0, min_tokens=3, stop_token_ids=[9], ignore_eos=ignore_eos
        )
        assert sampler(logits, [row(params, output=[5, 5])])[0].token_id == 11
        assert sampler(logits, [row(params, output=[5, 5, 5])])[0].token_id == EOS
    sampled = SamplingParams(temperature=1.0, min_tokens=1, stop_token_ids=[9])
    tokens = {r.token_id for r in sampler(logits.repeat(50, 1), [row(sampled)] * 50)}
    assert tokens == {11}


def test_temperature_sampling_follows_softmax():
    logits = torch.tensor([[0.0, 1.0, 2.0, -1.0] + [NEG_INF] * (VOCAB - 4)])
    temperature = 0.7
    n = 6000
    results = make_sampler()(logits.repeat(n, 1), [row(SamplingParams(temperature=0.7))] * n)
    freq = torch.bincount(torch.tensor([r.token_id for r in results]), minlength=VOCAB)
    want = torch.softmax(logits[0] / temperature, dim=-1)
    torch.testing.assert_close(freq.double() / n, want.double(), atol=0.02, rtol=0)


def test_truncation_in_the_sampler():
    logits = random_logits(1, VOCAB).repeat(300, 1)
    order = logits[0].argsort(descending=True).tolist()
    sampler = make_sampler()
    top2 = {r.token_id for r in sampler(logits, [row(SamplingParams(top_k=2))] * 300)}
    assert top2 == set(order[:2])
    probs = torch.softmax(logits[0], dim=-1)
    min_p = SamplingParams(min_p=0.3)
    allowed = set((probs >= 0.3 * probs.max()).nonzero().squeeze(1).tolist())
    assert {r.token_id for r in sampler(logits, [row(min_p)] * 300)} <= allowed
    nucleus = SamplingParams(top_p=0.5)
    reference = reference_top_k_top_p(logits[:1], [0], [0.5])
    allowed = set(torch.isfinite(reference[0]).nonzero().squeeze(1).tolist())
    assert {r.token_id for r in sampler(logits, [row(nucleus)] * 300)} <= allowed


def seeded_run(batch_of, steps=40, seed=1234, position=0, sampler_seed=0):
    """Tokens the seeded request draws at each step, sitting among `batch_of` others."""
    sampler = make_sampler(sampler_seed)
    params = SamplingParams(temperature=0.9, top_p=0.95, min_p=0.02, seed=seed)
    mine = sample_generator(seed, 0)
    others = [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=1.2, seed=7),
        SamplingParams(temperature=0.8, top_k=5),
        SamplingParams(temperature=1.0, repetition_penalty=1.2),
    ]
    other_gens = [sample_generator(99 + i, 0) if p.seed else None for i, p in enumerate(others)]
    tokens = []
    for step in range(steps):
        logits = random_logits(batch_of + 1, VOCAB, seed=1000 + step)
        my_logits = random_logits(1, VOCAB, seed=step)
        logits = torch.cat([logits[:position], my_logits, logits[position + 1 :]])
        rows = [
            row(others[i % 4], output=[1, 2], generator=other_gens[i % 4])
            for i in range(batch_of + 1)
        ]
        rows[position] = row(params, output=tokens, generator=mine)
        tokens.append(sampler(logits, rows)[position].token_id)
    return tokens


def test_seeded_request_is_independent_of_the_batch():
    alone = seeded_run(batch_of=0)
    assert len(set(alone)) > 5
    assert seeded_run(batch_of=5, position=3) == alone
    # Beyond one CPU chunk of rows, and with a differently seeded shared generator.
    assert seeded_run(batch_of=40, position=37, sampler_seed=5) == alone
    assert seeded_run(batch_of=0, seed=4321) != alone


def test_unseeded_rows_use_the_shared_generator():
    logits = random_logits(8, VOCAB)
    params = [row(SamplingParams(temperature=1.0))] * 8
    first = [r.token_id for r in make_sampler(3)(logits, params)]
    assert [r.token_id for r in make_sampler(3)(logits, params)] == first


def test_results_are_plain_python():
    results = make_sampler()(random_logits(2, VOCAB), [row(SamplingParams(logprobs=2))] * 2)
    assert all(isinstance(r, SampleResult) for r in results)
    assert all(isinstance(r.token_id, int) and isinstance(r.logprob, float) for r in results)


def test_bfloat16_logits_are_accepted():
    logits = random_logits(3, VOCAB).to(torch.bfloat16)
    results = make_sampler()(logits, [row(SamplingParams(temperature=0.0))] * 3)
    assert [r.token_id for r in results] == logits.float().argmax(dim=-1).tolist()


def test_empty_batch():
    assert make_sampler()(torch.empty(0, VOCAB), []) == []


@pytest.mark.parametrize("shape", [(2, VOCAB), (1, VOCAB + 1), (VOCAB,)])
def test_logits_shape_must_match_the_rows(shape):
    with pytest.raises(ValueError, match="logits must be"):
        make_sampler()(torch.zeros(shape), [row(SamplingParams())])


def test_sampler_arguments_are_checked():
    with pytest.raises(ValueError, match="vocab_size"):
        Sampler(0, set(), torch.Generator())
    with pytest.raises(ValueError, match="eos_token_ids"):
        Sampler(10, {10}, torch.Generator())


def test_plain_greedy_rows_cost_one_argmax_and_score_nothing():
    """The greedy fast path: the argmax of every row, no logprob, no randomness used."""
    sampler = make_sampler()
    state = sampler.generator.get_state()
    logits = random_logits(64, VOCAB)
    rows = [row(SamplingParams(temperature=0.0), output=[1]) for _ in range(64)]
    results = sampler(logits, rows)
    assert [r.token_id for r in results] == logits.argmax(dim=-1).tolist()
    assert all(r.logprob is None and r.top_logprobs is None for r in results)
    assert torch.equal(sampler.generator.get_state(), state)


def test_ranked_candidates_are_scored_without_logprobs_asked():
    """best_of > n ranks its samples by cumulative logprob: those rows are scored."""
    logits = random_logits(3, VOCAB)
    raw_logprobs = torch.log_softmax(logits, dim=-1)
    params = [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=0.0, n=1, best_of=3),
        SamplingParams(temperature=0.8, seed=1),
    ]
    results = make_sampler()(logits, [row(p) for p in params])
    assert results[0].logprob is None and results[2].logprob is None
    expected = raw_logprobs[1, results[1].token_id].item()
    assert results[1].logprob == pytest.approx(expected, abs=1e-5)
    assert results[1].top_logprobs is None


def test_greedy_takes_the_first_of_tied_maxima_as_argmax_does():
    logits = torch.zeros(4, VOCAB)
    logits[:, 7] = 2.0
    logits[:, 3] = 2.0  # tied with 7, earlier: chosen
    logits[2, 1] = 2.0
    rows = [row(SamplingParams(temperature=0.0)) for _ in range(4)]
    tokens = [r.token_id for r in make_sampler()(logits, rows)]
    assert tokens == logits.argmax(dim=-1).tolist() == [3, 3, 1, 3]
