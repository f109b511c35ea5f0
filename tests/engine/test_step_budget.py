"""The step budget's arithmetic and the prefill order, on made-up timings and sequences:
deterministic, no model."""

from __future__ import annotations

from loragate.engine import SamplingParams
from loragate.engine.prefill_order import prefill_order
from loragate.engine.sequence import Request, Sequence
from loragate.engine.step_budget import MAX_MEASURED_BUDGET, StepBudget, fit_line


def test_budget_is_what_fits_the_target_step_time():
    budget = StepBudget(500.0, floor=64, fixed_ms=50.0, ms_per_token=2.0)
    assert budget.tokens == 225  # (500 - 50) / 2
    assert budget.measured and "225 tokens" in budget.describe()


def test_slower_steps_shrink_the_budget_and_faster_ones_grow_it():
    budget = StepBudget(500.0, floor=16, fixed_ms=50.0, ms_per_token=2.0)
    for _ in range(30):
        budget.observe(200, 900.0)  # twice as slow as predicted (450 ms)
    assert 90 <= budget.tokens <= 110  # about (250 - 50) / 2
    for _ in range(30):
        budget.observe(200, 450.0)
    assert 215 <= budget.tokens <= 225


def test_budget_never_below_one_decode_batch_nor_above_the_cap():
    assert StepBudget(100.0, floor=64, fixed_ms=90.0, ms_per_token=5.0).tokens == 64
    assert StepBudget(100.0, floor=64, fixed_ms=1.0, ms_per_token=0.0).tokens == (
        MAX_MEASURED_BUDGET
    )
    assert StepBudget(1e6, floor=64, fixed_ms=1.0, ms_per_token=0.01).tokens == (
        MAX_MEASURED_BUDGET
    )


def test_explicit_budget_never_changes():
    budget = StepBudget(500.0, floor=8, fixed_tokens=48)
    budget.observe(48, 10_000.0)
    assert budget.tokens == 48 and not budget.measured


def test_fit_line():
    assert fit_line({16: 82.0, 128: 306.0}) == (50.0, 2.0)
    assert fit_line({16: 10.0, 128: 9.0}) == (10.0, 0.0)  # noise: no negative slope


def _seq(seq_id: int, length: int, arrival: float, outputs: int = 0) -> Sequence:
    request = Request(str(seq_id), None, list(range(1, length + 1)), SamplingParams())
    request.arrival_time = arrival
    seq = Sequence(seq_id, request, 0, None)
    seq.token_ids += [5] * outputs
    return seq


def test_shortest_prefill_first_with_resumed_and_aged_ones_ahead():
    long_old = _seq(0, 900, arrival=0.0)
    short = _seq(1, 20, arrival=5.0)
    medium = _seq(2, 200, arrival=4.0)
    resumed = _seq(3, 500, arrival=6.0, outputs=3)  # preempted after it started decoding
    waiting = [long_old, short, medium, resumed]
    order = prefill_order(waiting, "shortest_prefill", now=6.0, max_wait_s=10.0)
    assert [s.seq_id for s in order] == [3, 1, 2, 0]
    # Once the long prompt has waited max_wait_s, it goes before shorter ones.
    order = prefill_order(waiting, "shortest_prefill", now=10.0, max_wait_s=10.0)
    assert [s.seq_id for s in order] == [3, 0, 1, 2]
    assert prefill_order(waiting, "fcfs", now=6.0) == waiting
