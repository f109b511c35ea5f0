"""A burst of requests over more distinct adapters than the CPU tier holds (issue 46): the
tier never holds more than its bound, each adapter's files are read at most twice (once to
admit its request, once more at its turn where the tier was full then), and every answer is
PEFT's. Before, either the tier grew with the burst (weights read within the identity
book's racy window) or, for settled files, waiting requests' weights evicted each other
and were read again and again (the fleet check run: 1542 disk loads for 240 requests)."""

from __future__ import annotations

import time
from collections import Counter

import pytest
import torch
from tiny_llama import peft_greedy, peft_model_with
from transformers import AutoModelForCausalLM

from loragate.adapters import LoRARequest
from loragate.adapters import identity as identity_module
from loragate.adapters import loader as loader_module
from loragate.engine import SamplingParams
from loragate.engine.lora.adapter_residency import LOADER_THREADS
from loragate.tools import make_random_adapter

COUNT = 12
TIER = 3
N = 5
TARGETS = ["q_proj", "v_proj", "o_proj", "down_proj"]
RACY_NS = 50_000_000  # settled files: a stat vouches for them this long after written


@pytest.mark.parametrize("settled", [False, True], ids=["fresh-files", "settled-files"])
def test_a_burst_over_more_adapters_than_the_tier_holds(
    settled, tiny_model_dir, tmp_path, make_llm, monkeypatch
):
    # Fresh files: no stat vouches for them during the test (each admission reads them).
    monkeypatch.setattr(identity_module, "RACY_NS", RACY_NS if settled else 10**12)
    model_dir = tiny_model_dir("llama")
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    paths = {
        f"b{i:02d}": make_random_adapter(
            base, tmp_path / f"b{i:02d}", rank=4, targets=TARGETS, seed=i, init_scale=0.4
        )
        for i in range(COUNT)
    }
    loras = [LoRARequest(name, i + 1, str(p)) for i, (name, p) in enumerate(paths.items())]
    llm = make_llm(
        model=str(model_dir),
        dtype="float32",
        max_model_len=64,
        max_num_seqs=16,
        num_kv_blocks=128,
        enable_lora=True,
        max_loras=2,
        max_cpu_loras=TIER,
        max_lora_rank=8,
    )
    engine = llm.llm_engine
    residency = engine.residency
    if settled:  # every adapter read once before, long enough ago for a stat to vouch
        for lora in loras:
            residency.preload(lora)
        time.sleep(RACY_NS / 1e9 + 0.02)
        for lora in loras:
            residency.known_identity(lora)  # the stat that trusts them from now on
    reads = Counter()
    read = loader_module.load_adapter

    def counted(path, *args, **kwargs):
        reads[str(path)] += 1
        return read(path, *args, **kwargs)

    monkeypatch.setattr("loragate.adapters.cpu_tier.load_adapter", counted)

    prompts = [[1] + [(3000 + 17 * i + 5 * j) % 40000 for j in range(6)] for i in range(COUNT)]
    params = SamplingParams(temperature=0, max_tokens=N, min_tokens=N, ignore_eos=True)
    # The requests for the adapters in the tier come first: a request is added before
    # its weights are held, so one added after an earlier request's load has begun could
    # find them evicted by it and read again (it happened in 2 runs of 10, the load of the
    # first request racing the admission of the tenth).
    for i in reversed(range(COUNT)):
        engine.add_request(f"r{i}", {"prompt_token_ids": prompts[i]}, params, lora_request=loras[i])
    outputs, most = {}, 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                outputs[out.request_id] = list(out.outputs[0].token_ids)
        most = max(most, residency.counts()["cpu_adapters"])

    # A load that started with room may find every place held by requests admitted while
    # it read (their weights were in the tier already): it is kept, past the bound by at
    # most the loads under way, which start only while a loader thread is free.
    assert most <= TIER + LOADER_THREADS, f"the CPU tier held {most} adapters (bound {TIER})"
    assert max(reads.values()) <= (1 if settled else 2), reads
    assert set(reads) == {lora.lora_path for lora in loras} - (
        {lora.lora_path for lora in loras[-TIER:]} if settled else set()
    ), reads
    stats = residency.counts()
    assert stats["held_weights"] == 0, stats
    peft_model = peft_model_with(model_dir, paths)
    for i, (lora, prompt) in enumerate(zip(loras, prompts, strict=True)):
        assert outputs[f"r{i}"] == peft_greedy(peft_model, lora.lora_name, prompt, N), i
