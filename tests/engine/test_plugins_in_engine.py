"""The engine calls plugins for sampling, logits processing, eviction, preemption, metering."""

from __future__ import annotations

import pytest
import torch
from tiers_testlib import names_in_slots

from loragate.adapters import LoRARequest
from loragate.engine import SamplingParams
from loragate.plugins import hookimpl
from loragate.tools import make_random_adapter

PROMPT = {"prompt_token_ids": [1, 20, 30, 40]}


class FixedToken:
    """A sampler that always picks args['token'] (default 42)."""

    @hookimpl
    def loragate_samplers(self):
        def fixed(logits, args):
            return torch.tensor([a.get("token", 42) for a in args], dtype=torch.long)

        return {"fixed": fixed}


class Broken:
    @hookimpl
    def loragate_samplers(self):
        def explode(logits, args):
            raise RuntimeError("kaboom")

        return {"explode": explode}


class BanToken:
    """Bans token 99 for requests whose sampler_args ask for it."""

    @hookimpl
    def loragate_logits_processors(self, params):
        if not (params.get("sampler_args") or {}).get("ban_99"):
            return []

        def ban(output_token_ids, logits):
            logits = logits.clone()
            logits[99] = float("-inf")
            return logits

        return [ban]


class Recorder:
    def __init__(self):
        self.started, self.finished = [], []

    @hookimpl
    def loragate_request_started(self, info):
        self.started.append(info)

    @hookimpl
    def loragate_request_finished(self, info):
        self.finished.append(info)


class FailingObserver:
    @hookimpl
    def loragate_request_finished(self, info):
        raise ValueError("observer bug")


@pytest.fixture(scope="module")
def tiny_dir(tiny_model_dir):
    return str(tiny_model_dir("llama"))


def test_plugin_sampler_is_chosen_by_name(tiny_dir, make_llm):
    llm = make_llm(model=tiny_dir, max_model_len=64, num_kv_blocks=32, plugins=[FixedToken()])
    params = SamplingParams(
        sampler="fixed", sampler_args={"token": 7}, max_tokens=5, ignore_eos=True, logprobs=2
    )
    out = llm.generate(PROMPT, params, use_tqdm=False)[0].outputs[0]
    assert out.token_ids == [7] * 5
    assert len(out.logprobs) == 5 and 7 in out.logprobs[0]
    with pytest.raises(ValueError, match="unknown sampler 'nope'.*fixed"):
        llm.generate(PROMPT, SamplingParams(sampler="nope"), use_tqdm=False)


def test_failing_plugin_sampler_fails_only_its_request(tiny_dir, make_llm):
    llm = make_llm(
        model=tiny_dir, max_model_len=64, num_kv_blocks=32, plugins=[Broken(), FixedToken()]
    )
    outs = llm.generate(
        [PROMPT, PROMPT, PROMPT],
        [
            SamplingParams(temperature=0, max_tokens=6, ignore_eos=True),
            SamplingParams(sampler="explode", max_tokens=6),
            SamplingParams(sampler="fixed", max_tokens=6, ignore_eos=True),
        ],
        use_tqdm=False,
    )
    assert outs[1].outputs[0].finish_reason == "error"
    assert "explode" in outs[1].error and "Broken" in outs[1].error and "kaboom" in outs[1].error
    assert len(outs[0].outputs[0].token_ids) == 6 and outs[0].error is None
    assert outs[2].outputs[0].token_ids == [42] * 6
    assert llm.get_memory_stats()["allocated_blocks"] == 0


def test_logits_processor_plugin_applies_to_its_request(tiny_dir, make_llm):
    llm = make_llm(
        model=tiny_dir, max_model_len=64, num_kv_blocks=32, plugins=[BanToken(), FixedToken()]
    )
    # "fixed" would pick 99, but the processor bans it: the sampler sees -inf there.
    seen = {}

    class Spy:
        @hookimpl
        def loragate_samplers(self):
            def spy(logits, args):
                seen["logit_99"] = logits[:, 99].tolist()
                return logits.argmax(dim=-1)

            return {"spy": spy}

    llm.engine.plugins.register(Spy())
    banned = SamplingParams(sampler="spy", sampler_args={"ban_99": True}, max_tokens=1)
    llm.generate(PROMPT, banned, use_tqdm=False)
    assert seen["logit_99"] == [float("-inf")]
    llm.generate(PROMPT, SamplingParams(sampler="spy", max_tokens=1), use_tqdm=False)
    assert seen["logit_99"][0] > float("-inf")


def test_observers_see_every_request_and_their_failures_are_contained(tiny_dir, make_llm):
    recorder = Recorder()
    llm = make_llm(
        model=tiny_dir, max_model_len=64, num_kv_blocks=32, plugins=[recorder, FailingObserver()]
    )
    out = llm.generate(PROMPT, SamplingParams(max_tokens=3, ignore_eos=True), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 3
    assert [i["num_prompt_tokens"] for i in recorder.started] == [4]
    assert recorder.finished[0]["num_output_tokens"] == 3
    assert recorder.finished[0]["finish_reason"] == "length"


class OldestFirst:
    def __init__(self):
        self.choices = []

    @hookimpl
    def loragate_choose_preemption_victim(self, running):
        victim = min(running, key=lambda g: g["admitted_order"])["request_id"]
        self.choices.append(victim)
        return victim


def test_preemption_policy_plugin_chooses_the_victim(tiny_dir, make_llm):
    policy = OldestFirst()
    llm = make_llm(
        model=tiny_dir,
        max_model_len=128,
        num_kv_blocks=10,
        max_num_seqs=4,
        plugins=[policy],
        enable_prefix_caching=False,
    )
    engine = llm.engine
    params = SamplingParams(temperature=0, max_tokens=60, ignore_eos=True)
    for i in range(3):
        engine.add_request(f"r{i}", {"prompt_token_ids": [1] + [100 + i] * 30}, params)
    preempted = []
    while engine.has_unfinished_requests():
        scheduled = engine.scheduler.schedule()
        preempted += [s.request.request_id for s in scheduled.preempted]
        if not scheduled.empty:
            result = engine.runner.execute(scheduled)
            engine._records(engine.scheduler.update_from_output(scheduled, result))
    assert policy.choices and preempted
    assert preempted[0] == "r0"  # the oldest, where the built-in would take the newest
    assert preempted[: len(policy.choices)] == policy.choices[: len(preempted)]


class LargestFirst:
    @hookimpl
    def loragate_choose_adapter_victim(self, candidates, tier):
        return max(candidates, key=lambda c: (c["size_bytes"], c["name"]))["key"]


def test_adapter_eviction_policy_plugin_changes_the_victim(tiny_model_dir, tmp_path, make_llm):
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir("llama"))
    ranks = {"small": 2, "big": 8, "mid": 4}
    loras = {
        name: LoRARequest(
            name,
            i + 1,
            str(make_random_adapter(base, tmp_path / name, rank=r, targets=["q_proj"], seed=i)),
        )
        for i, (name, r) in enumerate(ranks.items())
    }

    def resident_after_order(order, plugins):
        llm = make_llm(
            model=str(tiny_model_dir("llama")),
            max_model_len=64,
            num_kv_blocks=32,
            enable_lora=True,
            max_loras=2,
            max_lora_rank=8,
            plugins=plugins,
        )
        for name in order:
            llm.generate(
                PROMPT, SamplingParams(max_tokens=2), lora_request=loras[name], use_tqdm=False
            )
        return names_in_slots(llm.engine.residency, loras.values())

    # "small" is least recently used; LRU evicts it, the plugin evicts the largest instead.
    assert resident_after_order(["small", "big", "mid"], []) == {"big", "mid"}
    assert resident_after_order(["small", "big", "mid"], [LargestFirst()]) == {"small", "mid"}


class PicksArg:
    """Returns args['token'] per row; raises if any row asks for a negative token."""

    @hookimpl
    def loragate_samplers(self):
        def pick(logits, args):
            if any(a["token"] < 0 for a in args):
                raise ValueError("negative token")
            return torch.tensor([a["token"] for a in args], dtype=torch.long)

        return {"pick": pick}


def test_a_row_that_breaks_a_shared_plugin_sampler_fails_alone(tiny_dir, make_llm):
    llm = make_llm(model=tiny_dir, max_model_len=64, num_kv_blocks=32, plugins=[PicksArg()])
    params = [
        SamplingParams(sampler="pick", sampler_args={"token": t}, max_tokens=3, ignore_eos=True)
        for t in (5, -1, 6)
    ]
    outs = llm.generate([PROMPT] * 3, params, use_tqdm=False)
    assert outs[0].outputs[0].token_ids == [5, 5, 5]
    assert outs[1].outputs[0].finish_reason == "error" and "negative token" in outs[1].error
    assert outs[2].outputs[0].token_ids == [6, 6, 6]


def test_seeded_random_plugin_sampler_varies_by_step(tiny_dir, make_llm):
    llm = make_llm(model=tiny_dir, max_model_len=64, num_kv_blocks=32)
    params = SamplingParams(
        sampler="random",
        sampler_args={"seed": 3, "temperature": 5.0},
        max_tokens=8,
        ignore_eos=True,
    )
    first = llm.generate(PROMPT, params, use_tqdm=False)[0].outputs[0].token_ids
    again = llm.generate(PROMPT, params, use_tqdm=False)[0].outputs[0].token_ids
    assert first == again and len(set(first)) > 1
