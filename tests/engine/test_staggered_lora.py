"""Mixed adapters (lora_alpha != r) in steps that mix prefill chunks and decodes: every
request's greedy tokens equal PEFT's for its adapter, on the tiny test model."""

from __future__ import annotations

import pytest
import torch
from staggered_testlib import drive, greedy, record_steps
from tiny_llama import ALL_MODULES, peft_greedy, peft_model_with
from transformers import AutoModelForCausalLM

from loragate.adapters import LoRARequest
from loragate.tools import make_random_adapter

N = 16
ADAPTERS = {"r4-a16": (4, 16), "r8-a2": (8, 2), "r6-a9": (6, 9)}  # name: (rank, alpha)


@pytest.fixture(scope="module")
def setup(tiny_model_dir, tmp_path_factory):
    model_dir = tiny_model_dir("llama")
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    root = tmp_path_factory.mktemp("alpha-adapters")
    paths = {
        name: make_random_adapter(
            base, root / name, rank=r, alpha=alpha, targets=ALL_MODULES, seed=10 + i, init_scale=0.3
        )
        for i, (name, (r, alpha)) in enumerate(ADAPTERS.items())
    }
    return str(model_dir), paths, peft_model_with(model_dir, paths)


@pytest.mark.parametrize("budget", [32, 256])
def test_mixed_adapters_joining_mid_batch_match_peft(setup, make_llm, budget):
    model_dir, paths, peft = setup
    loras = {name: LoRARequest(name, i + 1, str(p)) for i, (name, p) in enumerate(paths.items())}
    names = [*ADAPTERS, None, "r8-a2", "r4-a16", None, "r6-a9"]
    arrivals = [
        (
            2 * i,
            f"q{i}",
            [1] + [(500 + 61 * i + 17 * j) % 40000 for j in range(6 + 11 * i)],
            loras.get(name),
        )
        for i, name in enumerate(names)
    ]
    engine = make_llm(
        model=model_dir,
        max_model_len=256,
        num_kv_blocks=128,
        max_num_batched_tokens=budget,
        max_num_seqs=16,
        enable_lora=True,
        max_loras=3,
        max_lora_rank=8,
    ).engine
    log = record_steps(engine)
    outputs = drive(engine, arrivals, greedy(N))
    assert log.mixed_steps >= 3 and log.mixed_adapter_steps >= 3
    for (_, request_id, ids, _), name in zip(arrivals, names, strict=True):
        assert outputs[request_id] == peft_greedy(peft, name, ids, N), f"{request_id} ({name})"
