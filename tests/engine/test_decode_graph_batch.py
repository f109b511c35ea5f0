"""The padded static batch that CUDA graphs replay, run eagerly on the CPU (capture=False).

Graphs need CUDA, but what they compute is this batch: decode rows grouped by adapter slot,
padded to a bucket with rows that write no KV and use no adapter, block tables as wide as
max_model_len. Greedy outputs through it equal PEFT's token for token, while the batch
shrinks through the buckets, mixes adapters of several ranks, and ends base-model only.
With keep=True each bucket's batch is built once, over the static LoRA index a graph
replays, and run again every later step with its inputs rewritten in place: what a graph
does but for the capture (the lifetime of what it reads included only as far as Python
references keep it, which a CPU cannot get wrong).
"""

from __future__ import annotations

import pytest
from test_multi_lora import ADAPTERS, requests_for
from tiny_llama import make_adapters, peft_greedy, peft_model_with

from loragate.engine import SamplingParams
from loragate.engine.lora import adapter_residency
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


# The kept batch's LoRA runs through the Triton interpreter (about 10 ms a kernel program,
# every slot visited): two slots and few target modules keep the test to seconds.
KEPT_ADAPTERS = {  # name: (rank, targets, rslora)
    "r4-qv": (4, ["q_proj", "v_proj"], False),
    "r8-o": (8, ["o_proj"], False),
}


class CopiedSlots(adapter_residency.AdapterResidency):
    """Slots that hold copies of their adapters' rows, as on a GPU. On a CPU the engine's
    slots borrow the CPU tier's rows instead, and borrowed rows go through the native
    per-token kernels, which read the slot ids and never the static index's group ends."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **(kwargs | {"borrow": False}))


def test_a_batch_kept_across_steps_over_the_static_lora_index_matches_peft(
    make_llm, tiny_model_dir, tmp_path_factory, monkeypatch
):
    """What a captured graph replays, run eagerly: each (bucket, rank)'s batch built once
    over the static LoRA index (kernels.static_lora_index and DecodeGraphs' group_ends,
    through the Triton kernels in the interpreter) and run again every later step with its
    inputs rewritten in place, while the rows of a bucket finish one by one (its adapter
    groups shrink) and the batch steps down the buckets. A kept batch reading stale inputs,
    group ends or slot stacks gives other tokens here."""
    model_dir = tiny_model_dir("llama")
    paths = make_adapters(model_dir, tmp_path_factory.mktemp("kept"), KEPT_ADAPTERS)
    peft_model = peft_model_with(model_dir, paths)
    monkeypatch.setattr(adapter_residency, "AdapterResidency", CopiedSlots)
    llm = make_llm(
        model=str(model_dir),
        max_model_len=128,
        num_kv_blocks=64,
        max_num_seqs=8,
        enable_lora=True,
        max_loras=2,
        max_lora_rank=8,
    )
    engine = llm.llm_engine
    assert isinstance(engine.residency, CopiedSlots)
    graphs = DecodeGraphs(
        engine.model,
        engine.kv_cache,
        engine.residency,
        engine.runner.lora_rank,
        max_batch=8,
        max_model_len=engine.max_model_len,
        capture=False,
        keep=True,
    )
    built, ends_seen = [], set()
    build = graphs._batch
    graphs._batch = lambda bucket, rank: built.append((bucket, rank)) or build(bucket, rank)
    write = graphs._write_inputs

    def write_inputs(decodes, tables, bucket):
        rank = write(decodes, tables, bucket)
        ends_seen.add((bucket, tuple(graphs.group_ends.tolist())))
        return rank

    graphs._write_inputs = write_inputs
    engine.runner.decode_graphs = graphs
    loras = requests_for(paths)
    names = [None, "r4-qv", "r8-o", "r4-qv", "r8-o", "r4-qv", None]
    # Adapter rows finish one by one (7 rows to 2: buckets 8, 4, 2), base rows run longest.
    lengths = [20 if name is None else 6 + 2 * i for i, name in enumerate(names)]
    prompts = [[1] + list(range(300 + 11 * i, 310 + 13 * i)) for i in range(len(names))]
    outs = llm.generate(
        [{"prompt_token_ids": p} for p in prompts],
        [SamplingParams(temperature=0, max_tokens=n, min_tokens=n) for n in lengths],
        lora_request=[loras[n] if n else None for n in names],
        use_tqdm=False,
    )
    for name, prompt, n, out in zip(names, prompts, lengths, outs, strict=True):
        assert out.outputs[0].token_ids == peft_greedy(peft_model, name, prompt, n), name
    assert sorted(built) == sorted(set(built)) == sorted(graphs.kept), built  # once each
    assert graphs.replays >= 18 and graphs.replays >= 3 * len(built), (graphs.replays, built)
    assert {bucket for bucket, _ in built} >= {8, 4, 2}, built
    # The bucket of 8 ran one kept batch over several group ends, written in place.
    assert len({ends for bucket, ends in ends_seen if bucket == 8}) >= 3, ends_seen
    with_lora = [batch.lora for batch in graphs.kept.values() if batch.lora is not None]
    assert with_lora and all(lora.index.static for lora in with_lora)
    assert all(lora.backend == "triton" for lora in with_lora)  # the interpreter here
