"""One adapter's whole life in the engine, every count checked at each stage (issue 35).

A name is registered (its weights read into the CPU tier), asked for (its first token comes
in the very step that admits it, copied into a slot just before the forward pass), evicted
from its slot by another adapter, evicted from the CPU tier, served again after its files
change (the new weights, never the old), and unregistered while a request runs (refused
until the request ends, which keeps its weights). At the end every count is zero: slots,
CPU tier, holds (one per running request) and the engine's requests. Every output equals
PEFT's for the files the request was admitted under.
"""

from __future__ import annotations

import shutil

import pytest
import torch
from staggered_testlib import greedy
from tiny_llama import ALL_MODULES, peft_greedy, peft_model_with
from transformers import AutoModelForCausalLM

from loragate.adapters import LoRARequest
from loragate.tools import make_random_adapter

N = 8
PROMPT = [1, 523, 9123, 77, 4051, 300, 12, 881]


@pytest.fixture(scope="module")
def files(tiny_model_dir, tmp_path_factory):
    """Three adapters, and a second set of weights for the first one's folder."""
    model_dir = tiny_model_dir("llama")
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    root = tmp_path_factory.mktemp("lifecycle")

    def make(name: str, seed: int):
        return make_random_adapter(
            base, root / name, rank=8, targets=ALL_MODULES, seed=seed, init_scale=0.3
        )

    paths = {"a": make("a", 1), "b": make("b", 2), "c": make("c", 3), "a2": make("a2", 4)}
    return str(model_dir), paths, peft_model_with(model_dir, paths)


def counts(engine) -> dict[str, int]:
    stats = engine.adapters.stats()
    return {
        "slots": int(stats["resident_adapters"]),
        "cpu": int(stats["cpu_adapters"]),
        "holds": int(stats["held_weights"]),
        "requests": len(engine.requests),
    }


def run(engine, request_id: str, lora: LoRARequest) -> tuple[list[int], int, int]:
    """Serve one greedy request alone: its tokens, the engine step (counted from 1, after
    the request was added) that ran its prompt, by the step records, and the step that gave
    its first token. The first step is the one that admits it: nothing else waits."""
    engine.add_request(request_id, {"prompt_token_ids": PROMPT}, greedy(N), lora)
    admitted = first = None
    tokens: list[int] = []
    step = 0
    while engine.has_unfinished_requests():
        recorded = len(engine.step_records)
        outputs = engine.step()
        step += 1
        ran = len(engine.step_records) > recorded  # a step that scheduled nothing records none
        if admitted is None and ran and engine.step_records[-1].prefill_chunks:
            admitted = step
        for out in outputs:
            assert out.error is None, out.error
            if first is None and out.outputs[0].token_ids:
                first = step
            tokens = out.outputs[0].token_ids
    return tokens, admitted, first


def test_an_adapter_from_registration_to_removal(files, make_llm):
    model_dir, paths, peft = files
    engine = make_llm(
        model=model_dir,
        dtype="float32",
        max_model_len=128,
        num_kv_blocks=64,
        enable_lora=True,
        max_loras=1,
        max_cpu_loras=2,
        max_lora_rank=8,
    ).engine
    a, b, c = (LoRARequest(n, i + 1, str(paths[n])) for i, n in enumerate("abc"))
    expected = {name: peft_greedy(peft, name, PROMPT, N) for name in ("a", "b", "c", "a2")}
    assert len({tuple(t) for t in expected.values()}) == 4, "the adapters must differ"

    # Registered: read into the CPU tier, nothing in a slot, nothing held.
    engine.add_adapter(a)
    assert counts(engine) == {"slots": 0, "cpu": 1, "holds": 0, "requests": 0}

    # First request: weights in CPU memory, its first token in the step that admits it.
    loads = engine.adapters.stats()["slot_loads"]
    tokens, admitted, first = run(engine, "a-1", a)
    assert tokens == expected["a"]
    assert (admitted, first) == (1, 1), f"prompt ran in step {admitted}, first token {first}"
    assert engine.adapters.stats()["slot_loads"] == loads + 1
    assert counts(engine) == {"slots": 1, "cpu": 1, "holds": 0, "requests": 0}

    # Evicted from its slot: b takes the one slot; a stays in the CPU tier.
    tokens, admitted, first = run(engine, "b-1", b)
    assert tokens == expected["b"] and (admitted, first) == (1, 1)
    assert engine.adapters.stats()["device_evictions"] == 1
    tiers = engine.adapters.tiers()
    assert sorted(tiers.values()) == ["cpu", "device"], tiers
    assert counts(engine) == {"slots": 1, "cpu": 2, "holds": 0, "requests": 0}

    # Evicted from the CPU tier: c comes in, a (least recently used) leaves memory.
    identity_a = engine.adapters.preload(a).identity
    engine.adapters.preload(b)  # b used last, a is the oldest
    engine.add_adapter(c)
    assert not engine.adapters.in_memory(identity_a)
    assert engine.adapters.stats()["cpu_evictions"] == 1
    assert counts(engine) == {"slots": 1, "cpu": 2, "holds": 0, "requests": 0}

    # Files changed: a's folder now holds other weights; a request gets the new ones.
    shutil.rmtree(paths["a"])
    shutil.copytree(paths["a2"], paths["a"])
    tokens, admitted, first = run(engine, "a-2", a)
    assert tokens == expected["a2"], "the old weights were served after the files changed"
    assert (admitted, first) == (1, 1)

    # Unregistered while a request runs: refused, the request finishes on its weights.
    engine.add_request("a-3", {"prompt_token_ids": PROMPT}, greedy(N), a)
    engine.step()
    assert counts(engine)["holds"] == 1 and counts(engine)["requests"] == 1
    with pytest.raises(ValueError, match="running sequences use"):
        engine.remove_adapter(a)
    done = []
    while engine.has_unfinished_requests():
        done += [out for out in engine.step() if out.finished]
    assert done[0].outputs[0].token_ids == expected["a2"]
    assert counts(engine)["holds"] == 0

    # Removed, with every other adapter: every count is back to zero.
    for lora in (a, b, c):
        engine.remove_adapter(lora)
    assert counts(engine) == {"slots": 0, "cpu": 0, "holds": 0, "requests": 0}
    assert engine.adapters.tiers() == {}
    assert engine.get_memory_stats()["allocated_blocks"] == 0
