"""Checks of the persistent batch's sampling rows and penalty counts against ones rebuilt
from the sequences (tests/engine/test_sampling_batch.py, test_penalty_counts.py)."""

from __future__ import annotations

import torch

from loragate.engine import SamplingParams
from loragate.engine.core.sequence import Sequence
from loragate.engine.runner.input_batch import InputBatch
from loragate.engine.sampling.penalty_counts import NOT_BUILT
from loragate.engine.sampling.sampler import token_counts
from loragate.engine.sampling.sampling_batch import COLUMNS

NUMBERS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "min_tokens",
)


def expected_row(params: SamplingParams, generator) -> dict:
    """A row's values, straight from its SamplingParams (not through the batch's writer)."""
    want = {name: getattr(params, name) for name in NUMBERS}
    want["greedy"] = params.greedy
    want["penalised"] = params.has_penalties
    want["scored"] = params.scores_tokens
    want["seeded"] = generator is not None
    return {name: torch.tensor(value, dtype=COLUMNS[name]).item() for name, value in want.items()}


def check_rows(batch: InputBatch, live: list[Sequence]) -> None:
    """Every taken row holds its sequence's parameters and generator; every free row is
    clear; the count of rows past the greedy fast path is a recount."""
    sampling = batch.sampling
    seqs = {seq.seq_id: seq for seq in live}
    assert set(batch.row_of) == {i for i, s in seqs.items() if s.block_table}
    assert sampling.num_rows == batch.num_rows
    special = plugin_sampled = 0
    for seq_id, row in batch.row_of.items():
        seq = seqs[seq_id]
        params = seq.request.params
        got = {name: sampling.columns[name][row].item() for name in COLUMNS}
        assert got == expected_row(params, seq.generator), seq_id
        assert sampling.params[row] is params and sampling.generators[row] is seq.generator
        special += (
            not params.greedy
            or params.has_penalties
            or params.scores_tokens
            or params.min_tokens > 0
        )
        plugin_sampled += params.sampler is not None
    assert sampling.num_special == special
    assert sampling.num_plugin_sampled == plugin_sampled
    for row in set(range(batch.num_rows)) - set(batch.row_of.values()):
        for name, column in sampling.columns.items():
            assert not column[row].item(), f"free row {row} left a stale {name}"
        assert sampling.params[row] is None and sampling.generators[row] is None, row
        assert sampling.counts.counted[row] == NOT_BUILT, f"free row {row} kept its counts"
    check_counts(batch, live)


def check_counts(batch: InputBatch, live: list[Sequence]) -> None:
    """Every row whose penalty counts are built holds its sequence's prompt mask (where
    repetition_penalty applies) and the counts of the output tokens it has counted, as
    counts rebuilt from scratch give them."""
    counts = batch.sampling.counts
    assert counts.num_rows == batch.num_rows
    for seq in live:
        row = batch.row_of.get(seq.seq_id)
        if row is None or counts.counted[row] == NOT_BUILT:
            continue
        assert seq.request.params.has_penalties
        counted = counts.counted[row]
        assert counted <= len(seq.output_token_ids)
        vocab = counts.output_counts.shape[1]
        output = token_counts([seq.output_token_ids[:counted]], vocab, dtype=torch.int32)
        assert torch.equal(counts.output_counts[row], output[0]), f"row {row}: stale counts"
        repeats = seq.request.params.repetition_penalty != 1.0
        prompt = token_counts([seq.prompt_token_ids if repeats else []], vocab)[0] > 0
        assert torch.equal(counts.prompt_mask[row], prompt), f"row {row}: stale prompt mask"


def copied(generator: torch.Generator | None, copies: dict) -> torch.Generator | None:
    """A generator in the same state (one copy per original: rows sharing one still do)."""
    if generator is None:
        return None
    if id(generator) not in copies:
        copy = torch.Generator(device=generator.device)
        copy.set_state(generator.get_state())
        copies[id(generator)] = copy
    return copies[id(generator)]
