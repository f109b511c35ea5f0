"""Two hundred distinct adapters resident at once (slots that borrow the CPU tier: no slot
copies), requests over every one of them in mixed batches, every sampled answer equal to
PEFT's, and nothing left behind: no adapter evicted, no hold, slot or KV block kept."""

from __future__ import annotations

import random

import torch
from staggered_testlib import record_steps
from tiny_llama import peft_greedy, peft_model_with
from transformers import AutoModelForCausalLM

from loragate.adapters import LoRARequest
from loragate.engine import SamplingParams
from loragate.tools import make_random_adapter

COUNT = 200
SAMPLE = 20
N = 6
TARGETS = ["q_proj", "v_proj", "o_proj", "down_proj"]


def test_two_hundred_adapters_resident_in_mixed_batches(tiny_model_dir, tmp_path, make_llm):
    model_dir = tiny_model_dir("llama")
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    paths = {
        f"t{i:03d}": make_random_adapter(
            base,
            tmp_path / f"t{i:03d}",
            rank=4 + 4 * (i % 2),
            targets=TARGETS,
            seed=i,
            init_scale=0.4,
        )
        for i in range(COUNT)
    }
    loras = {name: LoRARequest(name, i + 1, str(p)) for i, (name, p) in enumerate(paths.items())}
    llm = make_llm(
        model=str(model_dir),
        dtype="float32",
        max_model_len=64,
        max_num_seqs=64,
        num_kv_blocks=256,
        enable_lora=True,
        max_loras=COUNT,
        max_cpu_loras=COUNT,
        max_lora_rank=8,
    )
    names = [*loras, None, None]
    random.Random(0).shuffle(names)
    prompts = [
        [1] + [(3000 + 17 * i + 5 * j) % 40000 for j in range(6 + i % 9)] for i in range(len(names))
    ]
    params = SamplingParams(temperature=0, max_tokens=N, min_tokens=N, ignore_eos=True)

    def run():
        return llm.generate(
            [{"prompt_token_ids": p} for p in prompts],
            params,
            lora_request=[loras.get(n) if n else None for n in names],
            use_tqdm=False,
        )

    first = run()  # reads every adapter from disk (they join as their reads finish)
    log = record_steps(llm.llm_engine)
    outs = run()  # all resident now: steps mix as many adapters as fit
    assert [o.outputs[0].token_ids for o in outs] == [o.outputs[0].token_ids for o in first]
    residency = llm.llm_engine.residency
    counts = residency.counts()
    assert counts["resident_adapters"] == COUNT, counts  # every one in a slot at once
    assert counts["held_weights"] == 0, counts
    assert not residency.in_flight_by_name(), residency.in_flight_by_name()
    sampled = random.Random(1).sample(list(loras), SAMPLE)
    peft = peft_model_with(model_dir, {name: paths[name] for name in sampled})
    at = {name: i for i, name in enumerate(names)}
    for name in [*sampled, None]:
        i = at[name]
        assert outs[i].outputs[0].token_ids == peft_greedy(peft, name, prompts[i], N), name
    widest = max(len(step["slots"] - {-1}) for step in log.steps)
    assert widest >= 32, f"at most {widest} adapters ran in one step"
