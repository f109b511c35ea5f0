"""The step budget's arithmetic and the prefill order, on made-up timings and sequences:
deterministic, no model."""

from __future__ import annotations

import pytest

from loragate.engine import SamplingParams
from loragate.engine.core.prefill_order import prefill_order
from loragate.engine.core.sequence import Request, Sequence
from loragate.engine.core.step_budget import MAX_MEASURED_BUDGET, StepBudget


def line(fixed: float, per_token: float, *sizes: int) -> dict[int, float]:
    return {n: fixed + per_token * n for n in sizes}


def test_budget_is_what_fits_the_target_step_time():
    budget = StepBudget(500.0, floor=64, timings=line(50.0, 2.0, 16, 128))
    assert (budget.fixed_ms, budget.ms_per_token) == pytest.approx((50.0, 2.0))
    assert budget.tokens == 225  # (500 - 50) / 2
    assert budget.measured and "225 tokens" in budget.describe()


def test_slower_steps_shrink_the_budget_and_faster_ones_grow_it():
    budget = StepBudget(500.0, floor=16, timings=line(50.0, 2.0, 16, 128))
    for i in range(60):  # the machine is now twice as slow
        n = 20 + 40 * (i % 5)
        budget.observe(n, 2 * (50.0 + 2.0 * n))
    assert 95 <= budget.tokens <= 105  # (500 - 100) / 4
    for i in range(60):
        n = 20 + 40 * (i % 5)
        budget.observe(n, 50.0 + 2.0 * n)
    assert 205 <= budget.tokens <= 225  # what is left of the slow steps fades


def test_noisy_warmup_gives_a_safe_budget_not_the_cap():
    """Timings where the larger size ran faster (a loaded machine) put all the time on the
    tokens: a smaller budget, never the cap."""
    budget = StepBudget(500.0, floor=16, timings={16: 300.0, 128: 250.0})
    assert budget.fixed_ms == 0.0 and budget.tokens == int(500 / (550 / 144))


def test_budget_never_below_one_decode_batch_nor_above_the_cap():
    assert StepBudget(100.0, floor=64, timings=line(90.0, 5.0, 16, 128)).tokens == 64
    # Flat timings (all fixed cost, as on a GPU): still a budget from the time per token.
    assert StepBudget(100.0, floor=64, timings=line(1.0, 0.0, 16, 128)).tokens == 7200
    assert StepBudget(1e6, floor=64, timings=line(1.0, 0.01, 16, 128)).tokens == (
        MAX_MEASURED_BUDGET
    )


def test_explicit_budget_never_changes():
    budget = StepBudget(500.0, floor=8, fixed_tokens=48)
    budget.observe(48, 10_000.0)
    assert budget.tokens == 48 and not budget.measured


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
