"""Constrained decoding in one call per step (issue 36): every constrained row's grammar
fills its row of one shared bitmask, one kernel call masks all of them in place, and rows no
processor touches are neither changed nor copied."""

from __future__ import annotations

import json

import jsonschema
import pytest
import torch
from structured_testlib import COLOR, POINT

from loragate import kernels
from loragate.engine import SamplingParams
from loragate.engine.sampling import grammar_masks
from loragate.engine.sampling.sample_dispatch import SampleDispatcher
from loragate.plugins import NamedHook, PluginError, PluginManager

VOCAB = 100


class Allow:
    """A grammar stand-in: allows the tokens in `allowed`; never called row by row."""

    def __init__(self, allowed: set[int], fails: bool = False):
        self.allowed, self.fails = allowed, fails

    def __call__(self, output_token_ids, logits):
        raise AssertionError("a bitmask processor should not be called row by row")

    def fill_bitmask(self, output_token_ids, bitmask, row):
        if self.fails:
            raise RuntimeError("the output left the grammar")
        bits = torch.zeros(bitmask.shape[1] * 32, dtype=torch.bool)
        bits[sorted(self.allowed)] = True
        packed = (bits.view(-1, 32).long() << torch.arange(32)).sum(1)
        bitmask[row] = packed.to(torch.int64).to(torch.int32)


class FakeRequest:
    def __init__(self, processors):
        self.logits_processors = [NamedHook("test", p) for p in processors]


class FakeSeq:
    def __init__(self, *processors):
        self.request = FakeRequest(processors)
        self.output_token_ids = [1, 2]


@pytest.fixture
def calls(monkeypatch):
    """Each call of the batched mask kernel: the rows it masked."""
    seen = []
    apply = kernels.apply_token_masks_

    def counted(logits, words, rows, backend=None):
        seen.append(rows.tolist())
        return apply(logits, words, rows, backend)

    monkeypatch.setattr(grammar_masks.kernels, "apply_token_masks_", counted)
    return seen


def test_several_constrained_rows_take_one_call_and_free_rows_are_untouched(calls):
    allowed = [{3, 4}, {50}, {0, 31, 32, 99}]
    seqs = [
        FakeSeq(),
        FakeSeq(Allow(allowed[0])),
        FakeSeq(),
        FakeSeq(Allow(allowed[1])),
        FakeSeq(Allow(allowed[2])),
        FakeSeq(),
    ]
    logits = torch.randn(6, VOCAB)
    before = logits.clone()
    dispatcher = SampleDispatcher(sampler=None, plugins=PluginManager.create())
    results = [None] * 6
    out = dispatcher.apply_logits_processors(seqs, logits, results, in_place=True)
    assert out is logits  # in place, no copy
    assert calls == [[1, 3, 4]]  # one call for all three constrained rows
    for free in (0, 2, 5):
        assert torch.equal(logits[free], before[free])
    for row, ok in zip((1, 3, 4), allowed, strict=True):
        keep = torch.zeros(VOCAB, dtype=torch.bool)
        keep[sorted(ok)] = True
        assert torch.equal(logits[row][keep], before[row][keep])
        assert bool((logits[row][~keep] == float("-inf")).all())
    assert results == [None] * 6


def test_a_failing_grammar_fails_its_row_alone(calls):
    seqs = [FakeSeq(Allow({1})), FakeSeq(Allow({2}, fails=True)), FakeSeq(Allow({3}))]
    logits = torch.randn(3, VOCAB)
    before = logits.clone()
    results = [None] * 3
    SampleDispatcher(None, PluginManager.create()).apply_logits_processors(
        seqs, logits, results, in_place=True
    )
    assert calls == [[0, 2]]
    assert isinstance(results[1], PluginError) and "left the grammar" in str(results[1])
    assert torch.equal(logits[1], before[1])
    assert results[0] is None and results[2] is None


def test_no_processor_means_no_copy(calls):
    logits = torch.randn(4, VOCAB)
    out = SampleDispatcher(None, PluginManager.create()).apply_logits_processors(
        [FakeSeq() for _ in range(4)], logits, [None] * 4
    )
    assert out is logits and calls == []


@pytest.mark.parametrize("backend", [None, "torch"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_batched_kernel_masks_only_its_rows(backend, dtype):
    gen = torch.Generator().manual_seed(0)
    vocab = 40 * 32 + 17
    logits = torch.randn(5, vocab, generator=gen).to(dtype)
    words = torch.randint(-(2**31), 2**31, (2, 41), generator=gen).to(torch.int32)
    before = logits.clone()
    rows = torch.tensor([3, 0])
    assert kernels.apply_token_masks_(logits, words, rows, backend=backend) is logits
    for r, w in zip((3, 0), words, strict=True):
        expected = before[r].clone()
        kernels.apply_token_mask_(expected, w, backend="torch")
        assert torch.equal(logits[r], expected)
    for free in (1, 2, 4):
        assert torch.equal(logits[free], before[free])


def test_the_batched_kernel_refuses_bad_input():
    with pytest.raises(ValueError, match="int32"):
        kernels.apply_token_masks_(torch.zeros(2, 4), torch.zeros(1, 1), torch.tensor([0]))
    with pytest.raises(IndexError, match="rows"):
        words = torch.zeros(1, 1, dtype=torch.int32)
        kernels.apply_token_masks_(torch.zeros(2, 4), words, torch.tensor([2]))


def test_constrained_requests_in_one_batch_use_one_call_per_step(tiny_model_dir, make_llm, calls):
    llm = make_llm(model=str(tiny_model_dir("llama")), max_model_len=256, num_kv_blocks=128)
    schemas = [COLOR, POINT, COLOR]
    params = [
        SamplingParams(temperature=0, max_tokens=48, structured_outputs={"json": s})
        for s in schemas
    ] + [SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)]
    prompts = [
        {"prompt_token_ids": [1] + list(range(300 + 17 * i, 320 + 17 * i))} for i in range(4)
    ]
    outs = llm.generate(prompts, params, use_tqdm=False)
    for schema, out in zip(schemas, outs, strict=False):
        jsonschema.validate(json.loads(out.outputs[0].text), schema)
    assert calls and all(len(rows) >= 1 for rows in calls)
    assert max(len(rows) for rows in calls) == 3  # the three constrained rows, in one call
    alone = llm.generate(prompts[3:], params[3:], use_tqdm=False)
    assert outs[3].outputs[0].token_ids == alone[0].outputs[0].token_ids  # the free row
