"""The padded static batch that CUDA graphs replay, run eagerly on the CPU (capture=False).

Graphs need CUDA, but what they compute is this batch: decode rows grouped by adapter slot,
padded to a bucket with rows that write no KV and use no adapter, block tables as wide as
max_model_len. Greedy outputs through it equal PEFT's token for token, while the batch
shrinks through the buckets, mixes adapters of several ranks, and ends base-model only.
"""

from __future__ import annotations

import pytest
from test_multi_lora import ADAPTERS, requests_for
from tiny_llama import make_adapters, peft_greedy, peft_model_with

from loragate.engine import SamplingParams
from loragate.engine.runner.cuda_graphs import DecodeGraphs, GraphCaptureError, batch_buckets


@pytest.fixture(scope="module")
def tiny_setup(tiny_model_dir, tmp_path_factory):
    model_dir = tiny_model_dir("llama")
    paths = make_adapters(model_dir, tmp_path_factory.mktemp("adapters"), ADAPTERS)
    return model_dir, paths, peft_model_with(model_dir, paths)


def test_buckets_cover_every_batch_size():
    assert batch_buckets(64) == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]
    assert batch_buckets(20) == [1, 2, 4, 8, 16, 20]
    assert batch_buckets(1) == [1]
    for top in (1, 3, 8, 13, 64):
        buckets = batch_buckets(top)
        assert all(any(b >= n for b in buckets) for n in range(1, top + 1))
        assert buckets[-1] == top


def test_padded_static_decode_batch_matches_peft(tiny_setup, make_llm):
    model_dir, paths, peft_model = tiny_setup
    llm = make_llm(
        model=str(model_dir),
        max_model_len=128,
        num_kv_blocks=160,
        max_num_seqs=16,
        enable_lora=True,
        max_loras=8,
        max_lora_rank=64,
    )
    engine = llm.llm_engine
    graphs = DecodeGraphs(
        engine.model,
        engine.kv_cache,
        engine.residency,
        engine.runner.lora_rank,
        max_batch=16,
        max_model_len=engine.max_model_len,
        capture=False,
    )
    engine.runner.decode_graphs = graphs
    loras = requests_for(paths)
    names = [None, *loras, None, *reversed(list(loras))]
    # Base rows run longest, so the last steps have no adapter row at all.
    lengths = [40 if name is None else 8 + 2 * i for i, name in enumerate(names)]
    prompts = [[1] + list(range(300 + 11 * i, 310 + 13 * i)) for i in range(len(names))]
    outs = llm.generate(
        [{"prompt_token_ids": p} for p in prompts],
        [SamplingParams(temperature=0, max_tokens=n, min_tokens=n) for n in lengths],
        lora_request=[loras.get(n) if n else None for n in names],
        use_tqdm=False,
    )
    for name, prompt, n, out in zip(names, prompts, lengths, outs, strict=True):
        assert out.outputs[0].token_ids == peft_greedy(peft_model, name, prompt, n), name
    buckets = {bucket for bucket, _ in graphs.keys_run}
    ranks = {rank for _, rank in graphs.keys_run}
    assert graphs.replays >= 25 and graphs.padded_rows > 0
    assert len(buckets) >= 3, graphs.keys_run
    assert 0 in ranks and max(ranks) == 64, graphs.keys_run


def test_a_failed_capture_leaves_the_engine_eager_and_correct(tiny_setup, make_llm):
    model_dir, paths, peft_model = tiny_setup
    llm = make_llm(model=str(model_dir), max_model_len=128, num_kv_blocks=64, max_num_seqs=4)
    engine = llm.llm_engine
    graphs = DecodeGraphs(
        engine.model, engine.kv_cache, None, None, max_batch=4, max_model_len=128, capture=False
    )
    calls = []

    def failing_run(decodes, tables):
        calls.append(len(decodes))
        raise GraphCaptureError("capture refused")

    graphs.run = failing_run
    engine.runner.decode_graphs = graphs
    prompts = [[1] + list(range(300 + 11 * i, 310 + 13 * i)) for i in range(3)]
    outs = llm.generate(
        [{"prompt_token_ids": p} for p in prompts],
        SamplingParams(temperature=0, max_tokens=12, min_tokens=12),
        use_tqdm=False,
    )
    assert calls == [3] and engine.runner.decode_graphs is None
    for prompt, out in zip(prompts, outs, strict=True):
        assert out.outputs[0].token_ids == peft_greedy(peft_model, None, prompt, 12)
