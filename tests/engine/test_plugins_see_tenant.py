"""Plugins see the tenant (issue 12): observers get the tenant's own name, never the
prefix-cache salt, and adapter eviction candidates carry the tenant and the pinned flag."""

from __future__ import annotations

import asyncio

from test_plugins_in_engine import PROMPT, Recorder
from tiers_testlib import names_in_slots
from transformers import AutoModelForCausalLM

from loragate.adapters import LoRARequest
from loragate.engine import SamplingParams
from loragate.engine.api.async_engine import AsyncLLMEngine
from loragate.plugins import hookimpl
from loragate.tools import make_random_adapter

SALT = "acme@1712345678.25"  # what the gateway passes for tenant "acme" to scope its KV


class CandidateRecorder:
    """Records every eviction choice it is asked for, then lets the built-in decide."""

    def __init__(self):
        self.calls: list[tuple[str, list[dict]]] = []

    @hookimpl
    def loragate_choose_adapter_victim(self, candidates, tier):
        self.calls.append((tier, candidates))


def test_an_observer_sees_the_tenants_own_name(tiny_model_dir, make_llm):
    recorder = Recorder()
    llm = make_llm(
        model=str(tiny_model_dir("llama")), max_model_len=64, num_kv_blocks=32, plugins=[recorder]
    )
    engine = AsyncLLMEngine(llm.engine)

    async def run(request_id, **who):
        params = SamplingParams(max_tokens=2, ignore_eos=True)
        return [o async for o in engine.generate(PROMPT, params, request_id, **who)]

    try:
        asyncio.run(run("acme-1", cache_salt=SALT, tenant="acme"))
        asyncio.run(run("operator-1"))
    finally:
        engine.shutdown()
    tenants = {i["request_id"]: i["tenant"] for i in recorder.started + recorder.finished}
    assert tenants == {"acme-1": "acme", "operator-1": None}
    assert [i["request_id"] for i in recorder.finished] == ["acme-1", "operator-1"]


def test_eviction_candidates_carry_tenant_and_pinned(tiny_model_dir, tmp_path, make_llm):
    model_dir = tiny_model_dir("llama")
    base = AutoModelForCausalLM.from_pretrained(model_dir)
    loras = {
        name: LoRARequest(
            name,
            i + 1,
            str(make_random_adapter(base, tmp_path / name, rank=4, targets=["q_proj"], seed=i)),
        )
        for i, name in enumerate(("sql", "tone", "house"))
    }
    recorder = CandidateRecorder()
    llm = make_llm(
        model=str(model_dir),
        max_model_len=64,
        num_kv_blocks=32,
        enable_lora=True,
        max_loras=2,
        max_cpu_loras=2,
        max_lora_rank=8,
        plugins=[recorder],
    )
    engine = llm.engine
    engine.pin_adapter(loras["sql"])
    params = SamplingParams(max_tokens=2, ignore_eos=True)
    for request_id, (name, tenant) in enumerate(
        [("sql", "acme"), ("tone", "globex"), ("house", None)]
    ):
        engine.add_request(str(request_id), PROMPT, params, loras[name], SALT, tenant=tenant)
        while engine.has_unfinished_requests():
            engine.step()
    device = [c for tier, cs in recorder.calls if tier == "device" for c in cs]
    seen = {(c["name"], c["tenant"], c["pinned"]) for c in device}
    assert seen == {("sql", "acme", True), ("tone", "globex", False)}
    cpu = [c for tier, cs in recorder.calls if tier == "cpu" for c in cs]
    assert cpu and all(c["pinned"] == (c["name"] == "sql") for c in cpu)
    # The built-in LRU evicts pinned adapters last: "tone" left the device, "sql" stayed.
    assert names_in_slots(engine.residency, loras.values()) == {"sql", "house"}
    engine.pin_adapter(loras["sql"], pinned=False)
    recorder.calls.clear()
    engine.add_request("3", PROMPT, params, loras["tone"], tenant="globex")
    while engine.has_unfinished_requests():
        engine.step()
    assert all(not c["pinned"] for _, cs in recorder.calls for c in cs)
