"""DoRA and lora_B-bias adapters served beside plain LoRA and base rows in one batch, with
staggered arrivals, chunked prefill and preemption: every row's float32 greedy tokens equal
PEFT's for that adapter alone (tiny model, every projection targeted). DoRA's column scales
are worked out once when the adapter is loaded, from the base weights read back from the
checkpoint; a lora_B bias is added to its rows only."""

from __future__ import annotations

import pytest
import torch
from staggered_testlib import TIGHT_LORA_ENGINE, drive_under_pressure
from tiny_llama import ALL_MODULES, peft_greedy, peft_model_with
from transformers import AutoModelForCausalLM

from loragate.adapters import LoRARequest
from loragate.tools import make_random_adapter

N = 12
# name: (rank, alpha, extra LoraConfig fields)
ADAPTERS = {
    "plain": (8, 16, {}),
    "dora": (4, 8, {"use_dora": True}),
    "dora-r8": (8, 4, {"use_dora": True, "alpha_pattern": {"v_proj": 12}}),
    "biased": (6, 6, {"lora_bias": True}),
}


@pytest.fixture(scope="module")
def setup(tiny_model_dir, tmp_path_factory):
    model_dir = tiny_model_dir("qwen2")  # q/k/v biases: DoRA keeps the base bias out
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    root = tmp_path_factory.mktemp("dora-adapters")
    paths = {
        name: make_random_adapter(
            base,
            root / name,
            rank=rank,
            alpha=alpha,
            targets=ALL_MODULES,
            seed=40 + i,
            init_scale=0.4,
            **extra,
        )
        for i, (name, (rank, alpha, extra)) in enumerate(ADAPTERS.items())
    }
    return str(model_dir), paths, peft_model_with(model_dir, paths)


def test_dora_and_biased_adapters_in_a_mixed_batch_match_peft(setup, make_llm):
    model_dir, paths, peft = setup
    loras = {name: LoRARequest(name, i + 1, str(p)) for i, (name, p) in enumerate(paths.items())}
    names = ["dora", None, "plain", "biased", "dora-r8", "dora", None, "biased", "plain"]
    arrivals = [
        (i, f"q{i}", [1] + [(900 + 37 * i + 13 * j) % 40000 for j in range(8 + 6 * i)], None)
        for i in range(len(names))
    ]
    arrivals = [
        (s, rid, ids, loras.get(n)) for (s, rid, ids, _), n in zip(arrivals, names, strict=True)
    ]
    engine = make_llm(model=model_dir, **TIGHT_LORA_ENGINE).engine
    outputs, _ = drive_under_pressure(engine, arrivals, N)
    for (_, rid, ids, _), name in zip(arrivals, names, strict=True):
        expected = peft_greedy(peft, name, ids, N)
        assert outputs[rid] == expected, f"{rid} ({name})"


def test_a_dora_adapter_knows_its_kind_and_size(setup, make_llm):
    model_dir, paths, _ = setup
    llm = make_llm(model=model_dir, dtype="float32", enable_lora=True, max_lora_rank=8)
    adapters = {
        name: llm.llm_engine.add_adapter(LoRARequest(name, i + 1, str(p)))
        for i, (name, p) in enumerate(paths.items())
    }
    assert {n: a.kind for n, a in adapters.items()} == {
        "plain": "lora",
        "dora": "dora",
        "dora-r8": "dora",
        "biased": "lora+bias",
    }
    scales = adapters["dora"].row_scales
    assert len(scales) == 2 * len(ALL_MODULES)  # two layers
    assert all(not torch.allclose(s, torch.ones_like(s)) for s in scales.values())
