"""The speculator's decisions, on plain objects: prompt lookup's proposals, the per-request
and per-adapter rules, and the step-time rule that keeps only the proposal tokens that pay
for their compute (deterministic: a fixed step-time model, no clock)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from loragate.adapters import LoRARequest
from loragate.engine import SamplingParams
from loragate.engine.core.sequence import Request, Sequence
from loragate.engine.speculation import SpeculativeConfig, Speculator, speculative_config_from
from loragate.engine.speculation.speculator import DRAFT_PROBE_EVERY, PROBE_EVERY
from loragate.plugins.builtin.ngram_proposer import lookup


@dataclass
class StepTime:
    fixed_ms: float
    ms_per_token: float


def row(seq_id: int, tokens: list[int], adapter: str | None = None, **params) -> Sequence:
    lora = LoRARequest(adapter, seq_id + 1, "/nowhere") if adapter else None
    params = SamplingParams(temperature=0, max_tokens=params.pop("max_tokens", 64), **params)
    request = Request(f"r{seq_id}", None, tokens[:4], params, lora_request=lora)
    seq = Sequence(seq_id, request, 0, None)
    seq.token_ids = list(tokens)
    return seq


def always(k: int):
    return lambda rows, options: [[7] * row["max_tokens"] for row in rows]


def test_prompt_lookup_proposes_what_followed_the_latest_longest_match():
    assert lookup([1, 2, 3, 9, 1, 2, 3, 8, 5, 1, 2, 3], 3, 1, 4) == [8, 5, 1]
    assert lookup([4, 5, 6, 4, 5], 4, 2, 3) == [6, 4, 5]
    assert lookup([1, 2, 3, 4], 3, 1, 4) == []  # the last token never occurred before
    assert lookup([1, 2, 1], 0, 1, 4) == []
    assert lookup([5, 5, 5, 5], 2, 1, 2) == [5]  # only tokens that exist are proposed


def test_config_forms_and_refusals():
    assert speculative_config_from(None) is None
    spec = speculative_config_from('{"method": "ngram", "num_speculative_tokens": 2}')
    assert spec == SpeculativeConfig(num_speculative_tokens=2)
    with pytest.raises(ValueError, match="only of it"):
        speculative_config_from({"method": "ngram", "model": "small"})
    with pytest.raises(ValueError, match="only of it"):
        speculative_config_from({"method": "draft_model"})
    with pytest.raises(ValueError, match="draft_adapters needs method 'draft_model'"):
        speculative_config_from({"method": "ngram", "draft_adapters": {"a": "/x"}})
    with pytest.raises(ValueError, match="must map adapter names to directories"):
        speculative_config_from({"method": "draft_model", "model": "m", "draft_adapters": ["x"]})
    with pytest.raises(ValueError, match="EAGLE"):
        speculative_config_from({"method": "eagle", "model": "heads"})
    with pytest.raises(ValueError, match="min_acceptance"):
        speculative_config_from({"method": "ngram", "min_acceptance": 1.5})


def test_opted_out_beam_and_finishing_rows_do_not_speculate():
    spec = Speculator(SpeculativeConfig(num_speculative_tokens=4), always(4), 128, 100)
    rows = [
        row(0, [1, 2, 3, 4, 5]),
        row(1, [1, 2, 3, 4, 5], speculative=False),
        row(2, [1, 2, 3, 4, 5, 6], max_tokens=3),  # 2 generated: only the bonus is left
        row(3, [1, 2, 3, 4, 5], max_tokens=3),  # 1 generated: 1 proposal token at most
    ]
    drafts = spec.drafts(rows, spare=100)
    assert drafts == {0: [7] * 4, 3: [7]}
    assert spec.drafts(rows, spare=2) == {0: [7, 7]}  # the spare budget bounds them all


def test_a_badly_answering_proposer_proposes_nothing():
    spec = Speculator(SpeculativeConfig(), lambda rows, options: [[100]], 128, 100)
    assert spec.drafts([row(0, [1, 2, 3, 4, 5])], spare=10) == {}  # 100 is past the vocab


def test_only_proposal_tokens_that_pay_for_their_compute_run():
    # 40 ms per step plus 2 ms per token: eight decodes take 56 ms.
    spec = Speculator(SpeculativeConfig(), always(4), 128, 100, StepTime(40.0, 2.0))
    rows = [row(i, [1, 2, 3, 4, 5], adapter="good" if i < 4 else "poor") for i in range(8)]
    for i in range(60):
        spec.record(rows[0], 4, 4)
        spec.record(rows[4], 4, 0 if i % 4 else 1)
    assert spec.acceptance_rate("good") > 0.95 and spec.acceptance_rate("poor") < 0.1
    drafts = spec.drafts(rows, spare=100)
    assert set(drafts) == {0, 1, 2, 3}  # the well-accepted adapter's rows alone
    assert all(len(d) == 4 for d in drafts.values())
    # The same rows with a per-token cost that dominates: fewer tokens pay off.
    costly = Speculator(SpeculativeConfig(), always(4), 128, 100, StepTime(0.5, 2.0))
    costly.acceptance = dict(spec.acceptance)
    assert sum(map(len, costly.drafts(rows, spare=100).values())) < 16
    # One stream, where the fixed cost dominates: even a middling rate speculates.
    single = Speculator(SpeculativeConfig(), always(4), 128, 100, StepTime(8.0, 2.0))
    alone = row(9, [1, 2, 3, 4, 5], adapter="middling")
    for _ in range(60):
        single.record(alone, 4, 3)
    assert single.drafts([alone], spare=100) == {9: [7, 7, 7]}  # rate 0.75: 3 of 4


def test_a_rows_own_rate_decides_among_rows_of_one_adapter():
    """Free text: one stream copies and another of the same adapter does not. The adapter's
    rate is middling; each row's own rate keeps the copying row's proposals and drops the
    other's (it only probes), and a finished row's history goes with it."""
    spec = Speculator(SpeculativeConfig(), always(4), 128, 100, StepTime(40.0, 2.0))
    copying, free = row(0, [1, 2, 3, 4, 5], "a"), row(1, [1, 2, 3, 4, 5], "a")
    for _ in range(30):
        spec.record(copying, 4, 4)
        spec.record(free, 4, 0)
    assert 0.4 < spec.acceptance_rate("a") < 0.6
    assert spec.row_rate(copying) > 0.9 and spec.row_rate(free) < 0.1
    probes = 0
    for _ in range(64):
        drafts = spec.drafts([copying, free], spare=100)
        assert drafts[0] == [7] * 4
        probes += 1 in drafts
        assert drafts.get(1, [7]) == [7]  # a probe is one token
    assert probes == 64 // 32
    newcomer = row(2, [1, 2, 3, 4, 5], "a")  # no history: its adapter's rate
    assert spec.row_rate(newcomer) == spec.acceptance_rate("a")
    spec.drafts([newcomer], spare=100)
    assert set(spec.rows) == set()  # rows 0 and 1 no longer decode: their history is gone


def test_rows_under_a_draft_model_probe_less_often():
    """A draft model's probe costs the row's whole context since it last proposed, run
    through the draft: after rejecting everything, its rows probe every DRAFT_PROBE_EVERY
    steps instead of PROBE_EVERY."""
    config = SpeculativeConfig(method="draft_model", model="/draft")
    spec = Speculator(config, always(4), 4096, 100)
    rejecting = row(0, [1, 2, 3, 4, 5], "a", max_tokens=4000)
    for _ in range(30):
        spec.record(rejecting, 4, 0)
    probes = sum(0 in spec.drafts([rejecting], spare=100) for _ in range(DRAFT_PROBE_EVERY))
    assert probes == 1 and DRAFT_PROBE_EVERY > PROBE_EVERY


def test_a_costly_draft_runs_only_where_it_pays():
    """A draft model's proposal token costs its own forward too: a draft 80% the target's
    size does not pay at acceptance 0.5 with eight rows; a small one at high acceptance
    still runs, alone or beside others."""
    rows = [row(i, [1, 2, 3, 4, 5], adapter="a") for i in range(8)]
    config = SpeculativeConfig(method="draft_model", model="/draft")
    big = Speculator(config, always(4), 128, 100, StepTime(40.0, 2.0), proposal_cost=0.8)
    small = Speculator(config, always(4), 128, 100, StepTime(40.0, 2.0), proposal_cost=0.05)
    lookup = Speculator(SpeculativeConfig(), always(4), 128, 100, StepTime(40.0, 2.0))
    for spec in (big, small, lookup):
        for _ in range(60):
            spec.record(rows[0], 4, 2 if spec is big else 4)
    assert big.drafts(rows, spare=100) == {}
    # ...and the draft is not even asked: its forwards are what would have cost.
    asked = []
    big.proposer = lambda rows, options: asked.append(rows) or [[7] * 4 for _ in rows]
    assert big.drafts(rows, spare=100) == {} and asked == []
    alone = small.drafts(rows[:1], spare=100)
    assert alone == {0: [7] * 4}
    # The same rates with and without the draft's cost: the cost only takes tokens away.
    with_cost = sum(map(len, small.drafts(rows, spare=100).values()))
    without = sum(map(len, lookup.drafts(rows, spare=100).values()))
    assert 0 < with_cost <= without
