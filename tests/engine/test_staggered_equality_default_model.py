"""The hard paths on the real model (SmolLM2-135M): requests joining running decodes,
chunked prefill, preemption by swap and by recompute, and mixed adapters with
lora_alpha != r, each equal to HF / PEFT greedy in float32."""

from __future__ import annotations

import pytest
import torch
from staggered_testlib import drive, greedy, record_steps
from tiny_llama import ALL_MODULES, hf_greedy, peft_greedy, peft_model_with
from transformers import AutoModelForCausalLM

from loragate.adapters import LoRARequest
from loragate.tools import make_random_adapter

pytestmark = pytest.mark.slow
N = 16
CHATS = [
    "Name three colours.",
    "Write two sentences about the moon and why it shows phases to people on Earth.",
    "Why do cats purr?",
    "List four rivers in Europe and the countries each one flows through, briefly.",
    "You help a small bakery. A customer asks which breads are gluten free, whether you "
    "deliver on Sundays, how long a sourdough loaf keeps, and if you bake to order for a "
    "wedding of eighty guests next month. Answer all four questions politely and briefly.",
]


@pytest.fixture(scope="module")
def prompts(default_llm):
    return [default_llm.apply_chat_template([{"role": "user", "content": c}]) for c in CHATS]


@pytest.mark.parametrize(("budget", "mode", "gap"), [(16, "recompute", 2), (64, "swap", 1)])
def test_staggered_chunked_preempted_match_hf(
    prompts, hf_default_model, make_llm, budget, mode, gap
):
    # 9 blocks of 16: five chat prompts of 30-100 tokens plus 16 new each need about 22, so
    # they fit only through preemptions; the longest is chunked at either budget.
    engine = make_llm(
        max_model_len=128,
        num_kv_blocks=9,
        max_num_batched_tokens=budget,
        max_num_seqs=4,
        preemption_mode=mode,
        swap_space=0.05,
    ).engine
    log = record_steps(engine)
    arrivals = [(gap * i, f"c{i}", p, None) for i, p in enumerate(prompts)]
    outputs = drive(engine, arrivals, greedy(N))
    assert log.partial_chunks >= 1 and log.mixed_steps >= 2
    assert engine.scheduler.num_preemptions >= 2
    if mode == "swap":
        assert engine.swapper.num_swap_ins >= 2
    for _, request_id, ids, _ in arrivals:
        assert outputs[request_id] == hf_greedy(hf_default_model, ids, N), request_id


def test_mixed_adapters_with_alpha_joining_mid_batch_match_peft(
    prompts, default_hf_dir, tmp_path, make_llm
):
    base = AutoModelForCausalLM.from_pretrained(default_hf_dir, dtype=torch.float32).eval()
    specs = {"r8-a32": (8, 32), "r4-a2": (4, 2)}
    paths = {
        name: make_random_adapter(
            base, tmp_path / name, rank=r, alpha=a, targets=ALL_MODULES, seed=i, init_scale=0.5
        )
        for i, (name, (r, a)) in enumerate(specs.items())
    }
    peft = peft_model_with(default_hf_dir, paths)
    loras = {n: LoRARequest(n, i + 1, str(p)) for i, (n, p) in enumerate(paths.items())}
    names = ["r8-a32", None, "r4-a2", "r8-a32", "r4-a2"]
    arrivals = [
        (2 * i, f"m{i}", p, loras.get(n))
        for i, (p, n) in enumerate(zip(prompts, names, strict=True))
    ]
    engine = make_llm(
        max_model_len=256,
        num_kv_blocks=64,
        max_num_batched_tokens=32,
        max_num_seqs=8,
        enable_lora=True,
        max_loras=2,
        max_lora_rank=8,
    ).engine
    log = record_steps(engine)
    outputs = drive(engine, arrivals, greedy(N))
    assert log.mixed_steps >= 2 and log.mixed_adapter_steps >= 2
    for (_, request_id, ids, _), name in zip(arrivals, names, strict=True):
        expected = peft_greedy(peft, name, ids, N)
        assert outputs[request_id] == expected, f"{request_id} ({name})"
