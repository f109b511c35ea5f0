"""A DoRA adapter and a modules_to_save adapter (whole copies of embed_tokens and lm_head)
replaced in place under the same name and id, and evicted from the device slots and the CPU
tier under churn (issue 45, must-show 3), by the method of test_adapter_files_change.py:
a long shared prompt (33 full KV blocks) with prefix caching on, greedy, float32, each answer
equal to PEFT's for the files on disk when the request was made. What could go stale here
beyond plain LoRA's weights: DoRA's column scales (worked out at load from the base weights)
and an adapter's own embedding table and output matrix in its slot."""

from __future__ import annotations

import pytest
import torch
from adapter_kinds_testlib import kind_specs, make_kind
from files_change_testlib import engine, put
from tiers_testlib import in_slots, weights_sha256
from tiny_llama import peft_greedy, peft_model_with
from transformers import AutoModelForCausalLM

from loragate.adapters import LoRARequest
from loragate.engine import SamplingParams

PROMPT = [
    1,
    *torch.randint(100, 20000, (541,), generator=torch.Generator().manual_seed(45)).tolist(),
]
N = 12
PARAMS = SamplingParams(temperature=0, max_tokens=N, min_tokens=N)
# Two versions of each kind (same shapes, so same file sizes) and a plain adapter to churn.
VERSIONS = {"dora1": "dora", "dora2": "dora", "saved1": "saved", "saved2": "saved"}
VERSIONS |= {"plain": "plain", "other": "plain"}


@pytest.fixture(scope="module")
def setup(tiny_model_dir, tmp_path_factory):
    model_dir = tiny_model_dir("llama")
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    root, specs = tmp_path_factory.mktemp("kinds-versions"), kind_specs([])
    paths = {
        name: make_kind(base, root / name, specs[kind], seed=300 + i)
        for i, (name, kind) in enumerate(VERSIONS.items())
    }
    expected = {}
    for name, path in paths.items():  # one PEFT model each: saved copies only apart
        expected[name] = peft_greedy(peft_model_with(model_dir, {name: path}), name, PROMPT, N)
    base_answer = peft_greedy(
        peft_model_with(model_dir, {"plain": paths["plain"]}), None, PROMPT, N
    )
    assert len({tuple(a) for a in [*expected.values(), base_answer]}) == len(paths) + 1
    return model_dir, paths, expected


def run(llm, lora):
    out = llm.generate({"prompt_token_ids": PROMPT}, PARAMS, lora_request=lora, use_tqdm=False)
    return out[0].outputs[0].token_ids


@pytest.mark.parametrize("kind", ["dora", "saved"])
def test_files_replaced_in_place_serve_the_new_weights_and_never_the_old_kv(
    setup, make_llm, tmp_path, kind
):
    model_dir, paths, expected = setup
    llm = engine(make_llm, model_dir, dtype="float32")
    x = tmp_path / "x"
    put(paths, f"{kind}1", x)
    lora = LoRARequest("x", 3, str(x))
    assert run(llm, lora) == expected[f"{kind}1"]
    hits = llm.get_memory_stats()["prefix_cache_hit_tokens"]
    assert run(llm, lora) == expected[f"{kind}1"]
    assert llm.get_memory_stats()["prefix_cache_hit_tokens"] - hits >= 512  # its KV reused
    put(paths, f"{kind}2", x)
    hits = llm.get_memory_stats()["prefix_cache_hit_tokens"]
    assert run(llm, lora) == expected[f"{kind}2"]
    assert llm.get_memory_stats()["prefix_cache_hit_tokens"] == hits, "old KV served for new"
    assert (
        llm.llm_engine.add_adapter(lora).kind
        == {"dora": "dora", "saved": "lora+saved-modules"}[kind]
    )
    put(paths, f"{kind}1", x)
    assert run(llm, LoRARequest("x", 4, str(x))) == expected[f"{kind}1"]
    uncached = engine(make_llm, model_dir, dtype="float32", prefix_caching=False)
    assert run(uncached, lora) == expected[f"{kind}1"]


@pytest.mark.parametrize("kind", ["dora", "saved"])
def test_old_weights_left_in_a_slot_after_the_cpu_tier_dropped_them(
    setup, make_llm, tmp_path, kind
):
    """The old version still sits in a device slot, the CPU tier has dropped it, the files
    hold the new one: the request runs the new one. Once its slot is gone too, the cached
    prompt KV (computed with the new one) is reused and still gives the new answer."""
    model_dir, paths, expected = setup
    llm = engine(make_llm, model_dir, dtype="float32", max_loras=2, max_cpu_loras=2)
    residency = llm.engine.residency
    y = tmp_path / "y"
    put(paths, f"{kind}1", y)
    lora_y = LoRARequest("y", 3, str(y))
    assert run(llm, lora_y) == expected[f"{kind}1"]
    old = residency.preload(lora_y).identity
    churn = [LoRARequest(n, 10 + i, str(paths[n])) for i, n in enumerate(("plain", "other"))]
    for lora in churn:  # registering two others pushes the old version out of the CPU tier
        residency.preload(lora)
    assert old.sha256 in in_slots(residency)
    assert "y" not in [r.lora_name for r in residency.cpu_resident()]
    put(paths, f"{kind}2", y)
    assert run(llm, lora_y) == expected[f"{kind}2"]
    for lora in churn:
        assert run(llm, lora) == expected[lora.lora_name]
    assert {old.sha256, weights_sha256(y)}.isdisjoint(in_slots(residency))
    hits = llm.get_memory_stats()["prefix_cache_hit_tokens"]
    assert run(llm, lora_y) == expected[f"{kind}2"]
    assert llm.get_memory_stats()["prefix_cache_hit_tokens"] - hits >= 512, "KV not reused"


def test_churn_over_one_slot_with_both_kinds_rewritten_between_rounds(setup, make_llm, tmp_path):
    """One device slot and one CPU entry: every request evicts the last one's weights. Each
    round rewrites both names' files to the other version; every answer is the version on
    disk, for DoRA, saved modules and plain LoRA alike."""
    model_dir, paths, expected = setup
    llm = engine(make_llm, model_dir, dtype="float32", max_loras=1, max_cpu_loras=1)
    d, s = tmp_path / "d", tmp_path / "s"
    plain = LoRARequest("plain", 20, str(paths["plain"]))
    for round_, version in enumerate(["1", "2", "1", "2"]):
        put(paths, f"dora{version}", d)
        put(paths, f"saved{version}", s)
        # Rounds 0 and 1 share an id (files changed in place), 2 and 3 a new one (re-registered).
        bump = round_ // 2
        order = [
            (LoRARequest("d", 30 + bump, str(d)), f"dora{version}"),
            (plain, "plain"),
            (LoRARequest("s", 40 + bump, str(s)), f"saved{version}"),
            (LoRARequest("d", 30 + bump, str(d)), f"dora{version}"),
        ]
        outs = llm.generate(
            [{"prompt_token_ids": PROMPT}] * len(order),
            PARAMS,
            lora_request=[lora for lora, _ in order],
            use_tqdm=False,
        )
        for out, (_, name) in zip(outs, order, strict=True):
            assert out.outputs[0].token_ids == expected[name], f"round {round_}: {name}"
    assert llm.engine.residency.counts()["held_weights"] == 0
