"""Many PEFT adapters in one batch: every request's greedy tokens equal PEFT's for its adapter."""

from __future__ import annotations

import pytest
from tiers_testlib import in_slots
from tiny_llama import ALL_MODULES, make_adapters, peft_greedy, peft_model_with

from loragate.adapters import LoRARequest
from loragate.engine import SamplingParams

ALL = list(ALL_MODULES)
ADAPTERS = {  # name: (rank, targets, rslora)
    "r4-attn": (4, ["q_proj", "v_proj"], False),
    "r6-odd": (6, ["q_proj", "o_proj", "down_proj"], False),
    "r8-all": (8, ALL, False),
    "r16-mlp-rslora": (16, ["gate_proj", "up_proj", "down_proj"], True),
    "r64-ko": (64, ["k_proj", "o_proj", "down_proj"], False),
    "r32-all-rslora": (32, ALL, True),
}


@pytest.fixture(scope="module")
def tiny_setup(tiny_model_dir, tmp_path_factory):
    model_dir = tiny_model_dir("llama")
    paths = make_adapters(model_dir, tmp_path_factory.mktemp("adapters"), ADAPTERS)
    return model_dir, paths, peft_model_with(model_dir, paths)


def requests_for(paths):
    return {name: LoRARequest(name, i + 1, str(p)) for i, (name, p) in enumerate(paths.items())}


def test_mixed_batch_matches_peft_per_adapter(tiny_setup, make_llm):
    model_dir, paths, peft_model = tiny_setup
    llm = make_llm(
        model=str(model_dir),
        max_model_len=128,
        num_kv_blocks=128,
        enable_lora=True,
        max_loras=8,
        max_lora_rank=64,
    )
    loras = requests_for(paths)
    names = [None, *loras, None, *reversed(list(loras))]
    prompts = [[1] + list(range(300 + 11 * i, 310 + 13 * i)) for i in range(len(names))]
    params = SamplingParams(temperature=0, max_tokens=24, min_tokens=24)
    outs = llm.generate(
        [{"prompt_token_ids": p} for p in prompts],
        params,
        lora_request=[loras.get(n) if n else None for n in names],
        use_tqdm=False,
    )
    for name, prompt, out in zip(names, prompts, outs, strict=True):
        expected = peft_greedy(peft_model, name, prompt, 24)
        assert out.outputs[0].token_ids == expected, f"adapter {name}"
    # The adapters really change the output (otherwise this test could not fail).
    base = peft_greedy(peft_model, None, prompts[0], 24)
    assert all(peft_greedy(peft_model, n, prompts[0], 24) != base for n in loras)


def test_alternating_base_and_adapters_do_not_contaminate(tiny_setup, make_llm):
    model_dir, paths, peft_model = tiny_setup
    llm = make_llm(
        model=str(model_dir),
        max_model_len=128,
        num_kv_blocks=128,
        enable_lora=True,
        max_loras=4,
        max_lora_rank=64,
    )
    loras = requests_for(paths)
    order = [None, "r8-all", None, "r32-all-rslora"] * 3
    prompt = [1, 500, 501, 502, 503]
    params = SamplingParams(temperature=0, max_tokens=20, min_tokens=20)
    outs = llm.generate(
        [{"prompt_token_ids": prompt}] * len(order),
        params,
        lora_request=[loras[n] if n else None for n in order],
        use_tqdm=False,
    )
    expected = {n: peft_greedy(peft_model, n, prompt, 20) for n in set(order)}
    assert len({tuple(v) for v in expected.values()}) == 3
    for name, out in zip(order, outs, strict=True):
        assert out.outputs[0].token_ids == expected[name]


def test_two_slots_six_adapters_all_complete_with_evictions(tiny_model_dir, tmp_path, make_llm):
    model_dir = tiny_model_dir("llama")
    specs = {f"a{i}": (8, ALL if i % 2 else ["q_proj", "v_proj"], False) for i in range(6)}
    paths = make_adapters(model_dir, tmp_path, specs)
    peft_model = peft_model_with(model_dir, paths)
    llm = make_llm(
        model=str(model_dir),
        max_model_len=128,
        num_kv_blocks=128,
        enable_lora=True,
        max_loras=2,
        max_lora_rank=8,
    )
    loras = requests_for(paths)
    names = [f"a{i % 6}" for i in range(12)]
    prompt = [1, 700, 701, 702]
    params = SamplingParams(temperature=0, max_tokens=12, min_tokens=12)
    outs = llm.generate(
        [{"prompt_token_ids": prompt}] * len(names),
        params,
        lora_request=[loras[n] for n in names],
        use_tqdm=False,
    )
    for name, out in zip(names, outs, strict=True):
        assert out.outputs[0].token_ids == peft_greedy(peft_model, name, prompt, 12), name
    stats = llm.engine.residency.counts()
    assert stats["device_evictions"] >= 4
    assert len(in_slots(llm.engine.residency)) <= 2


def test_same_name_new_path_is_a_new_adapter(tiny_model_dir, tmp_path, make_llm):
    model_dir = tiny_model_dir("llama")
    paths = make_adapters(model_dir, tmp_path, {"v1": (8, ALL, False), "v2": (8, ALL, False)})
    peft_model = peft_model_with(model_dir, paths)
    llm = make_llm(
        model=str(model_dir),
        max_model_len=128,
        num_kv_blocks=64,
        enable_lora=True,
        max_loras=2,
        max_lora_rank=8,
    )
    prompt = [1, 42, 43, 44]
    params = SamplingParams(temperature=0, max_tokens=12, min_tokens=12)
    first = LoRARequest("tenant-model", 1, str(paths["v1"]))
    second = LoRARequest("tenant-model", 2, str(paths["v2"]))
    out1 = llm.generate({"prompt_token_ids": prompt}, params, lora_request=first, use_tqdm=False)
    out2 = llm.generate({"prompt_token_ids": prompt}, params, lora_request=second, use_tqdm=False)
    assert out1[0].outputs[0].token_ids == peft_greedy(peft_model, "v1", prompt, 12)
    assert out2[0].outputs[0].token_ids == peft_greedy(peft_model, "v2", prompt, 12)


def test_default_model_adapters_match_peft(default_hf_dir, tmp_path, make_llm):
    specs = {k: ADAPTERS[k] for k in ("r4-attn", "r8-all", "r16-mlp-rslora", "r64-ko")}
    paths = make_adapters(default_hf_dir, tmp_path, specs, init_scale=0.5)
    peft_model = peft_model_with(default_hf_dir, paths)
    llm = make_llm(
        max_model_len=512, kv_cache_memory_gb=0.25, enable_lora=True, max_loras=4, max_lora_rank=64
    )
    loras = requests_for(paths)
    question = [{"role": "user", "content": "Name a large animal that lives in the sea."}]
    prompt = llm.apply_chat_template(question)
    names = [None, *loras]
    params = SamplingParams(temperature=0, max_tokens=16, min_tokens=16)
    outs = llm.generate(
        [{"prompt_token_ids": prompt}] * len(names),
        params,
        lora_request=[loras[n] if n else None for n in names],
        use_tqdm=False,
    )
    results = [o.outputs[0].token_ids for o in outs]
    for name, tokens in zip(names, results, strict=True):
        assert tokens == peft_greedy(peft_model, name, prompt, 16), f"adapter {name}"
    assert len({tuple(t) for t in results}) > 1
