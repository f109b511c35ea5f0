"""Decode steps replayed from CUDA graphs (skipped cleanly without a GPU).

Float32 greedy output through the graphs equals PEFT on the same GPU token for token, in a
mixed batch that shrinks through several buckets and ends base-model only; adapters
replaced in their slots between runs are read by the graphs already captured; bfloat16
through the graphs stays top-5-close to HF float32 at every step.
"""

from __future__ import annotations

import pytest
import torch
from test_cuda_engine import assert_top5_close, cuda_greedy, cuda_peft_model
from test_multi_lora import ADAPTERS, requests_for
from tiny_llama import make_adapters
from transformers import AutoModelForCausalLM

from loragate.engine import SamplingParams

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def graphs_of(llm):
    graphs = llm.llm_engine.runner.decode_graphs
    assert graphs is not None, "CUDA graphs are off"
    return graphs


def shrinking_batch(loras, base_rows: int = 2):
    names = [None] * base_rows + list(loras) + list(reversed(list(loras)))
    lengths = [40 if name is None else 8 + 2 * i for i, name in enumerate(names)]
    prompts = [[1] + list(range(300 + 11 * i, 310 + 13 * i)) for i in range(len(names))]
    return names, lengths, prompts


def generate(llm, loras, names, lengths, prompts):
    outs = llm.generate(
        [{"prompt_token_ids": p} for p in prompts],
        [SamplingParams(temperature=0, max_tokens=n, min_tokens=n) for n in lengths],
        lora_request=[loras[n] if n else None for n in names],
        use_tqdm=False,
    )
    return [out.outputs[0].token_ids for out in outs]


@pytest.fixture(scope="module")
def tiny_cuda(tiny_model_dir, tmp_path_factory):
    model_dir = tiny_model_dir("llama")
    paths = make_adapters(model_dir, tmp_path_factory.mktemp("adapters"), ADAPTERS)
    return model_dir, paths, cuda_peft_model(model_dir, paths)


def tiny_llm(make_llm, model_dir, **kwargs):
    options = dict(
        model=str(model_dir),
        device="cuda",
        dtype="float32",
        max_model_len=256,
        num_kv_blocks=256,
        max_num_seqs=16,
        enable_lora=True,
        max_lora_rank=64,
    )
    return make_llm(**(options | kwargs))


def test_graphs_match_peft_through_every_bucket(tiny_cuda, make_llm):
    model_dir, paths, peft_model = tiny_cuda
    llm = tiny_llm(make_llm, model_dir, max_loras=8)
    loras = requests_for(paths)
    names, lengths, prompts = shrinking_batch(loras)
    tokens = generate(llm, loras, names, lengths, prompts)
    for name, prompt, n, got in zip(names, prompts, lengths, tokens, strict=True):
        assert got == cuda_greedy(peft_model, name, prompt, n), name
    graphs = graphs_of(llm)
    ranks = {rank for _, rank in graphs.graphs}
    assert graphs.replays >= 30 and len(graphs.graphs) >= 4, sorted(graphs.graphs)
    assert 0 in ranks and 64 in ranks, sorted(graphs.graphs)
    eager = tiny_llm(make_llm, model_dir, max_loras=8, enforce_eager=True)
    assert eager.llm_engine.runner.decode_graphs is None
    assert generate(eager, loras, names, lengths, prompts) == tokens


def test_adapters_swapped_into_slots_are_read_by_captured_graphs(tiny_cuda, make_llm):
    """Two slots, six adapters: every run evicts and rewrites slots in place under graphs
    captured in earlier runs."""
    model_dir, paths, peft_model = tiny_cuda
    llm = tiny_llm(make_llm, model_dir, max_loras=2)
    loras = requests_for(paths)
    names = list(loras)
    for first in range(0, len(names), 2):
        pair = {n: loras[n] for n in names[first : first + 2]}
        batch_names, lengths, prompts = shrinking_batch(pair, base_rows=1)
        tokens = generate(llm, pair, batch_names, lengths, prompts)
        for name, prompt, n, got in zip(batch_names, prompts, lengths, tokens, strict=True):
            assert got == cuda_greedy(peft_model, name, prompt, n), name
    assert graphs_of(llm).replays >= 60


def test_bfloat16_graphs_are_top5_close_to_hf_float32(tiny_cuda, make_llm):
    model_dir, _, _ = tiny_cuda
    n = 32
    llm = make_llm(
        model=str(model_dir),
        device="cuda",
        dtype="bfloat16",
        max_model_len=256,
        num_kv_blocks=256,
        max_num_seqs=16,
    )
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).cuda().eval()
    prompts = [[1] + list(range(300 + 11 * i, 310 + 13 * i)) for i in range(11)]
    outs = llm.generate(
        [{"prompt_token_ids": p} for p in prompts],
        SamplingParams(temperature=0, max_tokens=n, min_tokens=n, logprobs=5),
        use_tqdm=False,
    )
    assert graphs_of(llm).replays >= n - 1
    assert_top5_close(hf, prompts, outs, n)
