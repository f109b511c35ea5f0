"""Stall-free batching (issue 22), shown on the engine's own step records: every running
decode is in every step, prompts are chunked within the token budget, greedy outputs stay
equal to HF's with and without a budget, and a budget too small for one decode batch is
refused at start."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from staggered_testlib import drive, greedy
from tiny_llama import hf_greedy
from transformers import AutoModelForCausalLM

from loragate.engine import LLM, EngineConfig
from loragate.gateway.assembly.cli import main as cli


def prompt(i: int, length: int) -> list[int]:
    return [1] + [(900 + 41 * i + 17 * j * (i + 1)) % 40000 + 300 for j in range(length - 1)]


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return str(tiny_model_dir("llama"))


def test_long_prompt_never_stalls_running_decodes(tiny, make_llm):
    """While 8 streams decode, a 1,500-token prompt arrives: every step that prefills it
    also decodes all 8, and its chunks fit the budget beside them."""
    budget = 256
    engine = make_llm(
        model=tiny,
        max_model_len=2048,
        num_kv_blocks=256,
        max_num_seqs=16,
        max_num_batched_tokens=budget,
    ).engine
    streams = [(0, f"s{i}", prompt(i, 20 + 3 * i), None) for i in range(8)]
    long_prompt = (3, "long", prompt(99, 1500), None)
    drive(engine, streams + [long_prompt], greedy(40))

    long_id = 8  # sequence ids count from 0 in arrival order
    stream_ids = set(range(8))
    chunks = [
        (record, n)
        for record in engine.step_records
        for seq_id, n in record.prefill_chunks
        if seq_id == long_id
    ]
    assert sum(n for _, n in chunks) == 1500
    assert len(chunks) >= 1500 // budget + 1  # split, not run whole
    for record, n in chunks:
        assert record.decodes_left_out == ()
        assert stream_ids <= set(record.decode_seq_ids), record
        assert n <= budget - len(record.decode_seq_ids), record
        assert record.num_tokens <= budget
    # Every step while the streams ran decoded all of them, not only the prefill steps.
    assert all(r.decodes_left_out == () for r in engine.step_records)


MIXED = [
    (0, "a", prompt(0, 5)),
    (0, "b", prompt(1, 300)),
    (1, "c", prompt(2, 40)),
    (2, "d", prompt(3, 130)),
    (2, "e", prompt(4, 17)),
    (5, "f", prompt(5, 90)),
    (7, "g", prompt(6, 210)),
    (9, "h", prompt(7, 3)),
]


@pytest.mark.parametrize("budget", [48, None])
def test_budget_bounds_prompt_tokens_and_outputs_match_hf(tiny, make_llm, budget):
    engine = make_llm(
        model=tiny,
        max_model_len=512,
        num_kv_blocks=128,
        max_num_seqs=8,
        max_num_batched_tokens=budget,
    ).engine
    outputs = drive(engine, [(s, rid, ids, None) for s, rid, ids in MIXED], greedy(16))
    records = list(engine.step_records)
    assert all(r.num_tokens <= r.budget for r in records)
    if budget is None:  # timed at start on this machine: at least one decode batch
        assert engine.step_budget.measured and engine.step_budget.tokens >= 8
    else:
        assert all(r.budget == budget and r.prefill_tokens <= budget for r in records)
        partial = sum(1 for r in records if r.prefill_tokens and r.decode_seq_ids)
        assert partial >= 5  # chunks really ran beside decodes
    hf = AutoModelForCausalLM.from_pretrained(tiny).eval()
    for _, request_id, ids in MIXED:
        assert outputs[request_id] == hf_greedy(hf, ids, 16), request_id


def test_budget_too_small_for_one_decode_batch_is_refused(tiny):
    with pytest.raises(ValueError, match=r"max_num_batched_tokens \(8\).*max_num_seqs \(16\)"):
        EngineConfig(max_num_batched_tokens=8, max_num_seqs=16)
    with pytest.raises(ValueError, match=r"\(8\).*\(16\)"):
        LLM(model=tiny, max_num_batched_tokens=8, max_num_seqs=16)
    result = CliRunner().invoke(
        cli, ["serve", "--model", tiny, "--max-num-batched-tokens", "8", "--max-num-seqs", "16"]
    )
    assert result.exit_code != 0
    assert "max_num_batched_tokens (8)" in result.output and "(16)" in result.output


@pytest.mark.parametrize(
    ("policy", "first_step"), [("shortest_prefill", [(1, 10), (0, 54)]), ("fcfs", [(0, 64)])]
)
def test_shorter_prompt_is_prefilled_first(tiny, make_llm, policy, first_step):
    """A short prompt queued behind a long one gets its first token first (shortest
    prefill first); `fcfs` keeps arrival order."""
    engine = make_llm(
        model=tiny,
        max_model_len=512,
        num_kv_blocks=64,
        max_num_seqs=8,
        max_num_batched_tokens=64,
        scheduling_policy=policy,
    ).engine
    engine.add_request("long", {"prompt_token_ids": prompt(0, 300)}, greedy(2))
    engine.add_request("short", {"prompt_token_ids": prompt(1, 10)}, greedy(2))
    while engine.has_unfinished_requests():
        engine.step()
    assert list(engine.step_records[0].prefill_chunks) == first_step
