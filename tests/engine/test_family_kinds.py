"""Adapter kinds on the other families (issue 45): DoRA on Phi-3's fused ``qkv_proj`` and
``gate_up_proj`` (its column scales over the fused output, each module's own columns), and an
embedding LoRA and trainable tokens on Gemma 3, whose embeddings are scaled by
sqrt(hidden) after the lookup (the adapter's rows and delta scaled with them), each beside a
plain adapter and base rows in one batch with staggered arrivals, chunked prefill and
preemption: every row's float32 greedy tokens equal to PEFT's for that adapter alone."""

from __future__ import annotations

import pytest
import torch
from adapter_kinds_testlib import make_kind
from family_models import LORA_TARGETS
from staggered_testlib import drive, greedy, record_steps
from test_model_families import assert_hard_paths_ran, engine_for, family_dir, prompts
from tiny_llama import peft_greedy, peft_model_with
from transformers import AutoModelForCausalLM

from loragate.adapters import LoRARequest

__all__ = ["family_dir"]  # the fixture, shared with the family tests

N = 12
PROMPTS = prompts(6)
# Trainable tokens that the prompts hold (first, middle and last positions).
TOKENS = sorted({PROMPTS[1][1], PROMPTS[3][7], PROMPTS[5][-1], PROMPTS[0][4]})


def kinds_for(family: str) -> dict[str, dict]:
    targets = list(LORA_TARGETS[family])
    if family == "phi3":
        return {
            "plain": dict(rank=8, alpha=16, targets=targets),
            "dora": dict(rank=4, alpha=8, targets=targets, use_dora=True),
            "dora-gate-up": dict(rank=8, alpha=4, targets=["gate_up_proj"], use_dora=True),
        }
    return {
        "plain": dict(rank=8, alpha=16, targets=targets),
        "embed-lora": dict(rank=4, targets=[*targets, "embed_tokens"]),
        "tokens": dict(rank=4, targets=targets, trainable_token_indices=TOKENS),
    }


@pytest.fixture(scope="module")
def kinds(family_dir, tmp_path_factory):
    made = {}

    def make(family: str):
        if family not in made:
            model_dir = family_dir(family)
            base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
            root = tmp_path_factory.mktemp(f"kinds-{family}")
            paths = {
                name: make_kind(base, root / name, spec, seed=60 + i)
                for i, (name, spec) in enumerate(kinds_for(family).items())
            }
            # One PEFT model per adapter: PEFT puts trainable tokens and an embedding LoRA on
            # one embedding in no single model.
            peft = {name: peft_model_with(model_dir, {name: path}) for name, path in paths.items()}
            made[family] = (model_dir, paths, peft)
        return made[family]

    return make


@pytest.mark.parametrize("family", ["phi3", "gemma3"])
def test_family_adapter_kinds_in_a_mixed_batch_match_peft(family, kinds, make_llm):
    model_dir, paths, models = kinds(family)

    def peft(name, ids):
        return peft_greedy(models[name or "plain"], name, ids, N)

    loras = {name: LoRARequest(name, i + 1, str(p)) for i, (name, p) in enumerate(paths.items())}
    special = [name for name in paths if name != "plain"]
    names = [special[0], None, "plain", special[1], special[0], special[1]]
    arrivals = [
        (i, f"k{i}", ids, loras.get(name))
        for i, (ids, name) in enumerate(zip(PROMPTS, names, strict=True))
    ]
    engine = engine_for(make_llm, model_dir, enable_lora=True, max_loras=3, max_lora_rank=8)
    log = record_steps(engine)
    outputs = drive(engine, arrivals, greedy(N))
    assert_hard_paths_ran(engine, log)
    assert log.mixed_adapter_steps >= 2
    for (_, rid, ids, _), name in zip(arrivals, names, strict=True):
        expected = peft(name, ids)
        assert outputs[rid] == expected, f"{family} {rid} ({name})"
    for name in special:  # each kind changes answers, or this test could not fail
        changed = [
            peft(name, ids) != peft("plain", ids) and peft(name, ids) != peft(None, ids)
            for ids in PROMPTS[:3]
        ]
        assert any(changed), f"{family} {name} answers as plain LoRA or the base"
