"""Sampling parameters in the persistent batch (engine/sampling/sampling_batch.py) against rows
rebuilt from scratch.

Each sequence's parameters are written into its row once, when it takes the row, and
cleared when it leaves (issue 36). Requests with every kind of sampling parameter join and
leave in random order (finishing, aborted, forked for n > 1, preempted by recompute and by
swap under a tight KV budget); at every step the sampler samples, each live row must hold
exactly what its sequence's SamplingParams say, every free row must be clear, and the
tokens and logprobs drawn from the persistent rows must equal those drawn from rows rebuilt
from the sequences, with copies of the same generators. Penalised rows' token counts
(engine/sampling/penalty_counts.py) must equal counts rebuilt from their sequences' histories, and a
free row must hold none.
"""

from __future__ import annotations

import random

import torch
from sampling_rows_testlib import check_counts, check_rows, copied

from loragate.engine import SamplingParams
from loragate.engine.core.sequence import Request, Sequence
from loragate.engine.runner.input_batch import InputBatch
from loragate.engine.sampling.sampler import Sampler, SamplingRow
from loragate.engine.sampling.sampling_batch import StepRows


class CheckingSampler:
    """The engine's sampler, checked each step against one given rows rebuilt from scratch.
    The dispatcher turns a sampler's exception into its requests' failure, so a failed check
    is also kept here for the test to raise."""

    def __init__(self, engine):
        self.engine = engine
        self.sampler = engine.dispatcher.sampler
        self.steps = 0
        self.failures: list[AssertionError] = []
        self.penalised_in_row: dict[int, int] = {}  # row -> the last penalised seq_id in it
        self.counts_reused = 0  # rows whose counts a second penalised sequence rebuilt

    def __call__(self, logits, rows):
        try:
            return self._checked(logits, rows)
        except AssertionError as exc:
            self.failures.append(exc)
            raise

    def _checked(self, logits, rows):
        engine, sampler = self.engine, self.sampler
        assert isinstance(rows, StepRows) and rows.batch is engine.runner.input_batch.sampling
        check_rows(engine.runner.input_batch, engine.scheduler.live_sequences())
        copies: dict = {}
        rebuilt = [
            SamplingRow(
                seq.request.params,
                list(seq.request.prompt_token_ids),
                seq.output_token_ids,
                copied(seq.generator, copies),
            )
            for seq in rows.histories
        ]
        shared = copied(sampler.generator, copies)
        want = Sampler(sampler.vocab_size, sampler.eos_token_ids, shared)(logits.clone(), rebuilt)
        got = sampler(logits, rows)
        counts = rows.batch.counts
        for i, seq in enumerate(rows.histories):  # each penalised row counted every token
            if rows.params(i).has_penalties:
                row = rows.rows[i]
                assert counts.counted[row] == len(seq.output_token_ids)
                before = self.penalised_in_row.setdefault(row, seq.seq_id)
                self.counts_reused += before != seq.seq_id
                self.penalised_in_row[row] = seq.seq_id
        check_counts(engine.runner.input_batch, engine.scheduler.live_sequences())
        assert [(r.token_id, r.logprob, r.top_logprobs) for r in got] == [
            (r.token_id, r.logprob, r.top_logprobs) for r in want
        ]
        for seq in rows.histories:  # every generator drew what its copy drew
            if seq.generator is not None:
                assert torch.equal(copies[id(seq.generator)].get_state(), seq.generator.get_state())
        assert torch.equal(shared.get_state(), sampler.generator.get_state())
        self.steps += 1
        return got


def random_params(rng: random.Random, seed: int) -> SamplingParams:
    n = rng.choice([1, 1, 1, 2, 3])
    kind = rng.randrange(8)
    params = dict(n=n, max_tokens=rng.randint(1, 30), ignore_eos=rng.random() < 0.7)
    if kind == 0 and n == 1:
        params.update(temperature=0.0)
    elif kind == 1 and n == 1:
        params.update(temperature=0.0, min_tokens=rng.randint(1, 6), stop_token_ids=[5, 7])
    elif kind == 2:
        params.update(temperature=0.8, top_k=rng.choice([1, 5, 40]))
    elif kind == 3:
        params.update(temperature=1.2, min_p=0.05, top_p=0.9)
    elif kind == 4:
        params.update(
            temperature=rng.choice([0.0, 0.7]) if n == 1 else 0.7,
            repetition_penalty=1.3,
            presence_penalty=0.4,
            frequency_penalty=0.2,
        )
    elif kind == 5:
        params.update(temperature=0.9, logprobs=rng.choice([0, 2]))
    elif kind == 6 and n == 1:
        params.update(temperature=0.0, best_of=2, seed=None)
    else:
        params.update(temperature=0.7)
    if rng.random() < 0.5 and "seed" not in params:
        params["seed"] = seed
    return SamplingParams(**params)


def test_200_joins_and_leaves_keep_every_sampling_row_equal_to_a_rebuilt_one(
    tiny_model_dir, make_llm
):
    llm = make_llm(
        model=str(tiny_model_dir("llama")),
        dtype="float32",
        max_model_len=128,
        max_num_seqs=8,  # forks of n > 1 outnumber it: the batch grows its rows
        block_size=8,
        num_kv_blocks=24,  # tight: preemptions by recompute and swap
        preemption_mode="swap",
        swap_space=0.00003,
        max_num_batched_tokens=24,
    )
    engine = llm.llm_engine
    checking = CheckingSampler(engine)
    engine.dispatcher.sampler = checking
    rng = random.Random(11)
    joined = left = 0
    live: list[str] = []
    while joined < 200 or engine.has_unfinished_requests():
        if joined < 200 and rng.random() < 0.6:
            prompt = [rng.randrange(100, 40000) for _ in range(rng.randint(1, 20))]
            request_id = f"r{joined}"
            engine.add_request(request_id, {"prompt_token_ids": prompt}, random_params(rng, joined))
            live.append(request_id)
            joined += 1
        if live and rng.random() < 0.1:
            left += engine.abort_request(live.pop(rng.randrange(len(live))))
        for out in engine.step():
            if out.finished:
                left += 1
                if out.request_id in live:
                    live.remove(out.request_id)
    if checking.failures:
        raise checking.failures[0]
    assert joined == 200 and left == 200
    assert engine.scheduler.num_preemptions > 0, "no preemption: the KV budget is too loose"
    assert engine.swapper.num_swap_ins > 0, "no swap-in"
    assert checking.steps > 100
    assert checking.counts_reused > 0, "no row's penalty counts were rebuilt for a newcomer"
    batch = engine.runner.input_batch
    assert batch.num_rows > 8, "n > 1 forks never grew the batch"
    batch.sync(engine.block_manager.take_changed_tables())
    assert batch.row_of == {}
    check_rows(batch, [])


def test_a_row_is_written_on_join_cleared_on_leave_and_kept_when_the_batch_grows():
    batch = InputBatch(max_rows=2, max_blocks_per_seq=4)
    greedy = Request("g", None, [1, 2], SamplingParams(temperature=0.0))
    seeded = Request("s", None, [3], SamplingParams(temperature=0.7, top_k=5, seed=3))
    a = Sequence(0, greedy, 0, None)
    b = Sequence(1, seeded, 0, torch.Generator().manual_seed(3))
    c = Sequence(2, seeded, 1, torch.Generator().manual_seed(4))
    a.block_table, b.block_table = [1], [2]
    batch.sync({0: a, 1: b})
    check_rows(batch, [a, b])
    assert batch.sampling.num_special == 1  # the greedy row takes the fast path
    rows = StepRows(batch.sampling, [batch.row_of[1], batch.row_of[0]], [b, a])
    assert rows.column("temperature").tolist() == [torch.tensor(0.7).item(), 0.0]
    assert rows.column("top_k").tolist() == [5, 0]
    assert not rows.all_plain_greedy()
    assert rows.select(torch.tensor([1])).all_plain_greedy()
    b.block_table = []  # b leaves: its row is cleared, then taken by c
    c.block_table = [3]
    batch.sync({1: b, 2: c})
    check_rows(batch, [a, c])
    a.block_table = []
    batch.sync({0: a})
    check_rows(batch, [c])
    a.block_table, b.block_table = [4], [5]  # both come back: the batch grows
    batch.sync({0: a, 1: b})
    assert batch.num_rows == 4
    check_rows(batch, [a, b, c])
    assert batch.sampling.num_special == 2
