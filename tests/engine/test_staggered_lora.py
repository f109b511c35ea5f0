"""Mixed adapters (lora_alpha != r) in steps that mix prefill chunks and decodes: every
request's greedy tokens equal PEFT's for its adapter, on the tiny test model."""

from __future__ import annotations

import pytest
import torch
from peft import PeftModel
from staggered_testlib import drive, greedy, record_steps
from tiny_llama import hf_greedy
from transformers import AutoModelForCausalLM

from loragate.adapters import LoRARequest
from loragate.tools import make_random_adapter

N = 16
ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
ADAPTERS = {"r4-a16": (4, 16), "r8-a2": (8, 2), "r6-a9": (6, 9)}  # name: (rank, alpha)


@pytest.fixture(scope="module")
def setup(tiny_model_dir, tmp_path_factory):
    model_dir = tiny_model_dir("llama")
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    root = tmp_path_factory.mktemp("alpha-adapters")
    paths = {
        name: make_random_adapter(
            base, root / name, rank=r, alpha=alpha, targets=ALL, seed=10 + i, init_scale=0.3
        )
        for i, (name, (r, alpha)) in enumerate(ADAPTERS.items())
    }
    names = list(paths)
    peft = PeftModel.from_pretrained(base, paths[names[0]], adapter_name=names[0])
    for name in names[1:]:
        peft.load_adapter(paths[name], adapter_name=name)
    return str(model_dir), paths, peft.eval()


def peft_greedy(peft, name: str | None, ids: list[int]) -> list[int]:
    if name is None:
        with peft.disable_adapter():
            return hf_greedy(peft, ids, N)
    peft.set_adapter(name)
    return hf_greedy(peft, ids, N)


@pytest.mark.parametrize("budget", [32, 256])
def test_mixed_adapters_joining_mid_batch_match_peft(setup, make_llm, budget):
    model_dir, paths, peft = setup
    loras = {name: LoRARequest(name, i + 1, str(p)) for i, (name, p) in enumerate(paths.items())}
    names = [*ADAPTERS, None, "r8-a2", "r4-a16", None, "r6-a9"]
    arrivals = [
        (2 * i, f"q{i}", [1] + [(500 + 61 * i + 17 * j) % 40000 for j in range(6 + 11 * i)],
         loras.get(name))
        for i, name in enumerate(names)
    ]  # fmt: skip
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
        assert outputs[request_id] == peft_greedy(peft, name, ids), f"{request_id} ({name})"
