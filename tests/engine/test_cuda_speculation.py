"""Speculative decoding on CUDA (issue 63; skipped cleanly without a GPU).

A mixed batch of base rows and four adapters that shrinks through several batch sizes, in
float32, greedy: a proposer plugin proposes PEFT's own continuation (run on the same GPU)
with every third token wrong, so rows accept runs and reject tokens in every step. The
tokens equal PEFT's and the same engine's without speculation, whose decodes replay CUDA
graphs; proposals were accepted for base rows and adapter rows, and some were rejected.
"""

from __future__ import annotations

import pytest
import torch
from test_cuda_engine import cuda_greedy
from test_cuda_graphs import generate, graphs_of, shrinking_batch, tiny_cuda, tiny_llm
from test_multi_lora import requests_for
from test_speculative_exact import OracleProposer

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


__all__ = ["tiny_cuda"]  # the fixture, shared with the graph tests


def test_verified_mixed_batch_equals_peft_and_the_graphed_engine(tiny_cuda, make_llm):
    model_dir, paths, peft_model = tiny_cuda
    loras = requests_for(paths)
    names, lengths, prompts = shrinking_batch(loras)
    expected = {
        tuple(prompt): cuda_greedy(peft_model, name, prompt, n)
        for name, prompt, n in zip(names, prompts, lengths, strict=True)
    }
    plain = tiny_llm(make_llm, model_dir, max_loras=8)
    without = generate(plain, loras, names, lengths, prompts)
    assert graphs_of(plain).replays > 0
    # A fixed budget: no step-time model timed on the wall clock decides what is verified.
    spec = {"method": "oracle", "num_speculative_tokens": 4}
    llm = tiny_llm(
        make_llm,
        model_dir,
        max_loras=8,
        max_num_batched_tokens=256,
        speculative_config=spec,
        plugins=[OracleProposer(expected)],
    )
    tokens = generate(llm, loras, names, lengths, prompts)
    assert tokens == without
    for name, prompt, got in zip(names, prompts, tokens, strict=True):
        assert got == expected[tuple(prompt)], name
    stats = {s["adapter"]: s for s in llm.llm_engine.scheduler.speculator.stats()}
    accepted = {name for name, s in stats.items() if s["accepted_tokens"] > 0}
    assert {None, *loras} <= accepted, stats
    assert any(s["draft_tokens"] > s["accepted_tokens"] for s in stats.values()), stats
