"""One adapter's whole life in the engine, every count checked at each stage (issue 35).

A name is registered (its weights read into the CPU tier), asked for (its first token comes
in the very step that admits it, copied into a slot just before the forward pass), evicted
from its slot by another adapter, evicted from the CPU tier, served again after its files
change (the new weights, never the old), and unregistered while a request runs (refused
until the request ends, which keeps its weights). At the end every count is zero: slots,
CPU tier, holds (one per running request), requests in flight per adapter and the engine's
requests. Every output equals PEFT's for the files the request was admitted under.

Requests go through an AsyncLLMEngine over the offline engine, as a server sends them: the
requests in flight are counted there (`adapter_in_flight`, from `generate` until the request
ends), and are 1 for the name while its request runs, 0 after. Between the stages the
engine thread is idle (it steps only while requests are unfinished), so the walk reads and
changes the adapters directly, as before.
"""

from __future__ import annotations

import asyncio
import shutil
import threading

import pytest
import torch
from staggered_testlib import greedy
from tiny_llama import ALL_MODULES, peft_greedy, peft_model_with
from transformers import AutoModelForCausalLM

from loragate.adapters import LoRARequest
from loragate.engine.api.async_engine import AsyncLLMEngine
from loragate.tools import make_random_adapter

N = 8
PROMPT = [1, 523, 9123, 77, 4051, 300, 12, 881]
WAIT_S = 60  # a bound for what takes well under a second, so a hang fails


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


def counts(engine, client, loras) -> dict[str, int]:
    stats = engine.residency.counts()
    return {
        "slots": int(stats["resident_adapters"]),
        "cpu": int(stats["cpu_adapters"]),
        "holds": int(stats["held_weights"]),
        "in_flight": sum(client.adapter_in_flight(lora) for lora in loras),
        "requests": len(engine.requests),
    }


class Steps:
    """The engine thread's steps (it calls `engine.step_tokens`), counted from 1 after the
    request was added: the step that ran its prompt, by the step records, and the step that
    gave its first token. With `pause_after`, the engine thread waits after that step until
    `resume` is set, so the test sees the request running and nothing moves under it."""

    def __init__(self, engine):
        self.engine = engine
        self._step_tokens = engine.step_tokens
        engine.step_tokens = self.step_tokens
        self.resume = threading.Event()
        self.reset()

    def reset(self, pause_after: int | None = None) -> None:
        self.count = 0
        self.admitted = self.first = None
        self.pause_after = pause_after
        self.paused = threading.Event()
        self.resume.clear()

    def step_tokens(self):
        records = self.engine.step_records
        recorded = len(records)
        step = self._step_tokens()
        self.count += 1
        ran = len(records) > recorded  # a step that scheduled nothing records none
        if self.admitted is None and ran and records[-1].prefill_chunks:
            self.admitted = self.count
        if self.first is None and any(s.results for r in step.requests for s in r.seqs):
            self.first = self.count
        if self.count == self.pause_after:
            self.paused.set()
            self.resume.wait()
        return step


async def stream(client, request_id: str, lora: LoRARequest) -> tuple[list, set[int]]:
    """One greedy request through `generate`: its outputs, and the requests in flight for
    its adapter seen at each output (while its stream runs)."""
    outputs, in_flight = [], set()
    prompt = {"prompt_token_ids": PROMPT}
    async for out in client.generate(prompt, greedy(N), request_id, lora):
        assert out.error is None, out.error
        in_flight.add(client.adapter_in_flight(lora))
        outputs.append(out)
    return outputs, in_flight


async def run(client, steps: Steps, request_id: str, lora: LoRARequest):
    """Serve one greedy request alone: its tokens, the engine step (counted from 1, after
    the request was added) that ran its prompt, the step that gave its first token, and the
    requests in flight for its adapter while it ran. The first step is the one that admits
    it: nothing else waits."""
    steps.reset()
    outputs, in_flight = await stream(client, request_id, lora)
    return outputs[-1].outputs[0].token_ids, steps.admitted, steps.first, in_flight


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
    steps = Steps(engine)
    client = AsyncLLMEngine(engine)

    def now() -> dict[str, int]:
        return counts(engine, client, (a, b, c))

    async def walk():
        # Registered: read into the CPU tier, nothing in a slot, nothing held.
        engine.add_adapter(a)
        assert now() == {"slots": 0, "cpu": 1, "holds": 0, "in_flight": 0, "requests": 0}

        # First request: weights in CPU memory, its first token in the step that admits it.
        loads = engine.residency.counts()["slot_loads"]
        tokens, admitted, first, in_flight = await run(client, steps, "a-1", a)
        assert tokens == expected["a"]
        assert (admitted, first) == (1, 1), f"prompt ran in step {admitted}, first token {first}"
        assert in_flight == {1}, in_flight
        assert engine.residency.counts()["slot_loads"] == loads + 1
        assert now() == {"slots": 1, "cpu": 1, "holds": 0, "in_flight": 0, "requests": 0}

        # Evicted from its slot: b takes the one slot; a stays in the CPU tier.
        tokens, admitted, first, in_flight = await run(client, steps, "b-1", b)
        assert tokens == expected["b"] and (admitted, first) == (1, 1)
        assert in_flight == {1}, in_flight
        assert engine.residency.counts()["device_evictions"] == 1
        tiers = engine.residency.tiers()
        assert sorted(tiers.values()) == ["cpu", "device"], tiers
        assert now() == {"slots": 1, "cpu": 2, "holds": 0, "in_flight": 0, "requests": 0}

        # Evicted from the CPU tier: c comes in, a (least recently used) leaves memory.
        identity_a = engine.residency.preload(a).identity
        engine.residency.preload(b)  # b used last, a is the oldest
        engine.add_adapter(c)
        assert not engine.residency.in_memory(identity_a)
        assert engine.residency.counts()["cpu_evictions"] == 1
        assert now() == {"slots": 1, "cpu": 2, "holds": 0, "in_flight": 0, "requests": 0}

        # Files changed: a's folder now holds other weights; a request gets the new ones.
        shutil.rmtree(paths["a"])
        shutil.copytree(paths["a2"], paths["a"])
        tokens, admitted, first, in_flight = await run(client, steps, "a-2", a)
        assert tokens == expected["a2"], "the old weights were served after the files changed"
        assert (admitted, first) == (1, 1)
        assert in_flight == {1}, in_flight
        assert now()["in_flight"] == 0

        # Unregistered while a request runs: refused, the request finishes on its weights.
        # The engine thread waits after the request's first step while the test looks.
        steps.reset(pause_after=1)
        running = asyncio.create_task(stream(client, "a-3", a))
        assert await asyncio.to_thread(steps.paused.wait, WAIT_S), "the request never ran"
        assert now()["holds"] == 1 and now()["requests"] == 1
        assert client.adapter_in_flight(a) == 1 and now()["in_flight"] == 1
        with pytest.raises(ValueError, match="running sequences use"):
            engine.remove_adapter(a)
        steps.resume.set()
        await asyncio.wait_for(client.wait_adapter_idle(a), WAIT_S)  # once the request ended
        outputs, in_flight = await running
        done = [out for out in outputs if out.finished]
        assert done[0].outputs[0].token_ids == expected["a2"]
        assert in_flight == {1}, in_flight
        assert now()["holds"] == 0 and now()["in_flight"] == 0

    try:
        asyncio.run(walk())
    finally:
        steps.resume.set()  # a walk that failed while the engine thread waited
        client.shutdown()

    # Removed, with every other adapter: every count is back to zero.
    for lora in (a, b, c):
        engine.remove_adapter(lora)
    assert now() == {"slots": 0, "cpu": 0, "holds": 0, "in_flight": 0, "requests": 0}
    assert engine.residency.tiers() == {}
    assert engine.get_memory_stats()["allocated_blocks"] == 0
