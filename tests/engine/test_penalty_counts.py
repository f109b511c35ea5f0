"""Penalty token counts kept per row of the persistent batch (engine/sampling/penalty_counts.py)
against counts rebuilt from scratch.

Sequences with penalties (and without) join and leave rows in random order: finishing or
aborted, preempted and coming back with their outputs (recompute, swap-in), forked from a
live sequence with its history, cut back to fewer tokens (a stop string), growing by more
than one token between samples. At every step the tokens and logprobs sampled from the
persistent rows, greedy and seeded, in float32, must equal those sampled from rows rebuilt
from the histories, and every row's counts must equal a recount.
"""

from __future__ import annotations

import random

import pytest
import torch
from sampling_rows_testlib import check_counts, check_rows, copied

from loragate.engine import SamplingParams
from loragate.engine.core.sequence import Request, Sequence, sample_generator
from loragate.engine.runner.input_batch import InputBatch
from loragate.engine.sampling.penalty_counts import NOT_BUILT
from loragate.engine.sampling.sampler import Sampler, SamplingRow
from loragate.engine.sampling.sampling_batch import StepRows

VOCAB = 50


def random_params(rng: random.Random, seed: int) -> SamplingParams:
    penalties = rng.choice(
        [
            {},
            {"repetition_penalty": 1.3},
            {"presence_penalty": 0.5},
            {"frequency_penalty": 0.7},
            {"repetition_penalty": 0.8, "presence_penalty": -0.3, "frequency_penalty": 0.4},
        ]
    )
    temperature = rng.choice([0.0, 0.0, 0.7, 1.3])
    extra = {"logprobs": 2} if rng.random() < 0.3 else {}
    if temperature and rng.random() < 0.5:
        extra["top_p"] = 0.8
    seed_arg = {"seed": seed} if temperature and rng.random() < 0.7 else {}
    return SamplingParams(temperature=temperature, max_tokens=100, **penalties, **extra, **seed_arg)


def new_sequence(rng: random.Random, seq_id: int, parent: Sequence | None = None) -> Sequence:
    if parent is None:
        prompt = [rng.randrange(VOCAB) for _ in range(rng.randint(1, 12))]
        request = Request(f"r{seq_id}", None, prompt, random_params(rng, seq_id))
    else:
        request = parent.request
    seq = Sequence(seq_id, request, seq_id, sample_generator(request.params.seed, seq_id))
    if parent is not None:
        seq.token_ids = list(parent.token_ids)
    return seq


def step(batch: InputBatch, sampler: Sampler, seqs: list[Sequence], logits) -> list:
    """Sample the rows of `seqs` from the persistent batch, checked against rows rebuilt
    from the histories with copies of the same generators."""
    copies: dict = {}
    rebuilt = [
        SamplingRow(
            seq.request.params,
            list(seq.prompt_token_ids),
            list(seq.output_token_ids),
            copied(seq.generator, copies),
        )
        for seq in seqs
    ]
    shared = copied(sampler.generator, copies)
    want = Sampler(VOCAB, sampler.eos_token_ids, shared)(logits.clone(), rebuilt)
    rows = StepRows(batch.sampling, [batch.row_of[seq.seq_id] for seq in seqs], seqs)
    got = sampler(logits, rows)
    assert [(r.token_id, r.logprob, r.top_logprobs) for r in got] == [
        (r.token_id, r.logprob, r.top_logprobs) for r in want
    ]
    return got


def test_400_random_joins_leaves_forks_and_cuts_keep_counts_equal_to_a_recount():
    rng = random.Random(5)
    torch_rng = torch.Generator().manual_seed(5)
    batch = InputBatch(max_rows=2, max_blocks_per_seq=4)  # forks grow it
    sampler = Sampler(VOCAB, {0}, torch.Generator().manual_seed(1))
    live: list[Sequence] = []  # holding a row
    waiting: list[Sequence] = []  # left their row with their outputs (preempted, swapped)
    next_id = 0
    rebuilds = 0
    for _ in range(400):
        op = rng.random()
        changed: dict[int, Sequence] = {}
        if (op < 0.15 and len(live) < 10) or not live:
            seq = new_sequence(rng, next_id)
            next_id += 1
            seq.block_table = [1]
            live.append(seq)
            changed[seq.seq_id] = seq
        elif op < 0.25:  # finished or aborted: the row is freed for good
            seq = live.pop(rng.randrange(len(live)))
            seq.block_table = []
            changed[seq.seq_id] = seq
        elif op < 0.35:  # preempted or swapped out: it comes back later, outputs kept
            seq = live.pop(rng.randrange(len(live)))
            seq.block_table = []
            waiting.append(seq)
            changed[seq.seq_id] = seq
        elif op < 0.45 and waiting:
            seq = waiting.pop(rng.randrange(len(waiting)))
            seq.block_table = [2]
            live.append(seq)
            changed[seq.seq_id] = seq
        elif op < 0.55 and len(live) < 10:  # a fork with its parent's history
            seq = new_sequence(rng, next_id, parent=rng.choice(live))
            next_id += 1
            seq.block_table = [3]
            live.append(seq)
            changed[seq.seq_id] = seq
        batch.sync(changed)
        check_rows(batch, live)
        cut = None
        if 0.55 <= op < 0.6:  # tokens cut off (a stop string): its counts must shrink too
            cut = rng.choice(live)
            if cut.num_tokens > cut.prompt_len:
                del cut.token_ids[rng.randint(cut.prompt_len, cut.num_tokens - 1) :]
        counted = list(batch.sampling.counts.counted)
        seqs = rng.sample(live, rng.randint(1, len(live)))  # not every row samples each step
        if cut is not None and cut not in seqs:
            seqs.append(cut)
        logits = torch.randn(len(seqs), VOCAB, generator=torch_rng) * 3
        for seq, result in zip(seqs, step(batch, sampler, seqs, logits), strict=True):
            row = batch.row_of[seq.seq_id]
            if seq.request.params.has_penalties:
                assert batch.sampling.counts.counted[row] == len(seq.output_token_ids)
                rebuilds += counted[row] == NOT_BUILT
            seq.token_ids.append(result.token_id)
            if rng.random() < 0.1:  # a token taken outside the sampler (beam search)
                seq.token_ids.append(rng.randrange(VOCAB))
        check_counts(batch, live + waiting)
    assert batch.num_rows > 2 and rebuilds > 20
    for seq in live:
        seq.block_table = []
    batch.sync({seq.seq_id: seq for seq in live})
    assert set(batch.sampling.counts.counted) == {NOT_BUILT}


def penalised_step(batch: InputBatch, seq: Sequence, vocab: int = VOCAB):
    rows = StepRows(batch.sampling, [batch.row_of[seq.seq_id]], [seq])
    return rows.penalty_counts([0], vocab, torch.device("cpu"))


def test_a_step_adds_only_the_tokens_appended_since_the_last():
    params = SamplingParams(temperature=0.0, repetition_penalty=1.2, frequency_penalty=0.5)
    seq = Sequence(0, Request("r", None, [3, 3, 4], params), 0, None)
    seq.block_table = [1]
    batch = InputBatch(max_rows=1, max_blocks_per_seq=4)
    batch.sync({0: seq})
    assert batch.sampling.counts.counted == [NOT_BUILT]
    seq.token_ids += [7, 7]
    prompt, output = penalised_step(batch, seq)
    assert prompt[0].nonzero().squeeze(1).tolist() == [3, 4]
    assert output[0, 7].item() == 2 and output.sum().item() == 2
    assert batch.sampling.counts.counted == [2]
    # The history is not read again: counts already taken are not counted twice.
    seq.token_ids.append(9)
    prompt, output = penalised_step(batch, seq)
    assert output[0, 7].item() == 2 and output[0, 9].item() == 1 and output.sum().item() == 3
    assert batch.sampling.counts.counted == [3]


def test_a_bad_token_id_raises_and_leaves_the_counts_as_they_were():
    params = SamplingParams(temperature=0.0, presence_penalty=0.5, repetition_penalty=1.1)
    seq = Sequence(0, Request("r", None, [1], params), 0, None)
    seq.block_table = [1]
    batch = InputBatch(max_rows=1, max_blocks_per_seq=4)
    batch.sync({0: seq})
    seq.token_ids.append(2)
    penalised_step(batch, seq)
    before = batch.sampling.counts.output_counts.clone()
    seq.token_ids += [5, VOCAB]
    with pytest.raises(ValueError, match=f"token id {VOCAB} is outside the vocabulary"):
        penalised_step(batch, seq)
    assert torch.equal(batch.sampling.counts.output_counts, before)
    assert batch.sampling.counts.counted == [1]
