"""Greedy tokens equal HF's where the engine is hardest, on the tiny test model: requests
arriving while others decode, chunked prefill, prefix-cache hits mid-batch, preemption by
recompute and by swap. Each test also checks that the hard path really ran."""

from __future__ import annotations

import asyncio

import pytest
from staggered_testlib import drive, greedy, record_steps
from tiny_llama import hf_greedy
from transformers import AutoModelForCausalLM

from loragate.engine import EngineConfig, LLMEngine
from loragate.engine.api.async_engine import AsyncLLMEngine

N = 20


def prompt(i: int, length: int) -> list[int]:
    return [1] + [(1000 + 37 * i + 13 * j * (i + 1)) % 40000 + 300 for j in range(length - 1)]


# (arrival step, request id, prompt): lengths cross block boundaries (block_size 16).
STAGGERED = [
    (0, "a", prompt(0, 5)),
    (1, "b", prompt(1, 33)),
    (3, "c", prompt(2, 16)),
    (4, "d", prompt(3, 70)),
    (9, "e", prompt(4, 17)),
    (14, "f", prompt(5, 48)),
]


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return str(tiny_model_dir("llama"))


@pytest.fixture(scope="module")
def expected(tiny):
    """HF's greedy tokens for every prompt used here, computed once."""
    model = AutoModelForCausalLM.from_pretrained(tiny).eval()
    cache = {}

    def of(ids: list[int], n: int = N) -> list[int]:
        key = (tuple(ids), n)
        if key not in cache:
            cache[key] = hf_greedy(model, ids, n)
        return cache[key]

    return of


def check(outputs: dict, arrivals, expected) -> None:
    for _, request_id, ids, *_ in arrivals:
        assert outputs[request_id] == expected(ids), f"request {request_id} differs from HF"


def arrivals_of(items):
    return [(step, rid, ids, None) for step, rid, ids in items]


def test_requests_joining_running_decodes_match_hf(tiny, expected, make_llm):
    engine = make_llm(model=tiny, max_model_len=256, num_kv_blocks=128).engine
    log = record_steps(engine)
    outputs = drive(engine, arrivals_of(STAGGERED), greedy(N))
    assert log.mixed_steps >= 4
    check(outputs, STAGGERED, expected)


@pytest.mark.parametrize("budget", [16, 64])
def test_chunked_prefill_matches_unchunked_and_hf(tiny, expected, make_llm, budget):
    long_ones = STAGGERED + [(2, "g", prompt(6, 130)), (6, "h", prompt(7, 95))]
    chunked = make_llm(
        model=tiny,
        max_model_len=256,
        num_kv_blocks=128,
        max_num_batched_tokens=budget,
        max_num_seqs=min(budget, 16),
    ).engine
    log = record_steps(chunked)
    outputs = drive(chunked, arrivals_of(long_ones), greedy(N))
    assert log.partial_chunks >= 3 and log.mixed_steps >= 3
    whole = make_llm(
        model=tiny, max_model_len=256, num_kv_blocks=128, enable_chunked_prefill=False
    ).engine
    unchunked = drive(whole, arrivals_of(long_ones), greedy(N))
    assert outputs == unchunked
    check(outputs, long_ones, expected)


def test_prefix_cache_hits_arriving_mid_batch_match_hf(tiny, expected, make_llm):
    shared = prompt(8, 40)
    items = [(0, "first", shared + [501, 502])] + [
        (2 + 3 * i, f"hit{i}", shared + prompt(9 + i, 3 + 9 * i)[1:]) for i in range(4)
    ]
    engine = make_llm(
        model=tiny, max_model_len=256, num_kv_blocks=128, enable_prefix_caching=True
    ).engine
    log = record_steps(engine)
    outputs = drive(engine, arrivals_of(items), greedy(N))
    stats = engine.get_memory_stats()
    assert stats["prefix_cache_hit_tokens"] >= 4 * 32 and log.mixed_steps >= 4
    check(outputs, items, expected)


def test_prefix_cache_evicted_blocks_are_not_reused_stale(tiny, expected, make_llm):
    """Once a cached prefix's blocks are handed to other sequences, asking for the prefix
    again recomputes it: no block answers for tokens it no longer holds."""
    shared = prompt(20, 49)
    fillers = [(1 + i, f"fill{i}", prompt(30 + i, 60)) for i in range(4)]
    items = [(0, "first", shared)] + fillers + [(30, "again", shared[:40] + [777, 778])]
    # 16 blocks: the fillers need every one, so the freed prefix blocks are taken.
    engine = make_llm(
        model=tiny,
        max_model_len=128,
        num_kv_blocks=16,
        max_num_seqs=4,
        enable_prefix_caching=True,
    ).engine
    outputs = drive(engine, arrivals_of(items), greedy(N))
    check(outputs, items, expected)


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_preemption_under_tight_kv_matches_hf(tiny, expected, make_llm, mode):
    """8 sequences growing to 58-93 tokens need about 40 blocks; 14 force many preemptions."""
    items = [(i // 2, f"p{i}", prompt(40 + i, 10 + 5 * i)) for i in range(8)]
    engine = make_llm(
        model=tiny,
        max_model_len=128,
        num_kv_blocks=14,
        max_num_seqs=8,
        preemption_mode=mode,
        swap_space=0.01,
    ).engine
    log = record_steps(engine)
    outputs = drive(engine, arrivals_of(items), greedy(48))
    assert engine.scheduler.num_preemptions >= 4 and log.mixed_steps >= 2
    if mode == "swap":
        assert engine.swapper.num_swap_ins >= 4
    for _, request_id, ids in items:
        assert outputs[request_id] == expected(ids, 48), request_id


async def test_async_requests_joining_streams_match_hf(tiny, expected):
    """Each request starts once the previous one has streamed a few tokens."""
    config = EngineConfig(model=tiny, max_model_len=256, num_kv_blocks=128)
    engine = AsyncLLMEngine(LLMEngine(config))
    items = [(0, rid, ids) for _, rid, ids in STAGGERED]
    started = [asyncio.Event() for _ in items]

    async def run(i: int, request_id: str, ids: list[int]) -> list[int]:
        if i:
            await started[i - 1].wait()
        final = None
        async for out in engine.generate({"prompt_token_ids": ids}, greedy(N), request_id):
            if len(out.outputs[0].token_ids) >= 3:
                started[i].set()
            final = out
        return final.outputs[0].token_ids

    try:
        results = await asyncio.gather(*(run(i, rid, ids) for i, (_, rid, ids) in enumerate(items)))
    finally:
        engine.shutdown()
    for (_, _, ids), tokens in zip(items, results, strict=True):
        assert tokens == expected(ids)
    assert engine.engine.get_memory_stats()["allocated_blocks"] == 0
