"""The engine counts each adapter's requests in flight (issue 35: one reference count per
request, owned by AdapterResidency; the gateway asks it whether an adapter is idle), and
tells listeners when the weights behind an adapter's name change.

A request counts from `generate`'s first step, before anything is awaited (its adapter may
still be loading), until it ends: finished, aborted, refused or failed, exactly once.
"""

from __future__ import annotations

import asyncio

import pytest
from tiny_llama import ALL_MODULES, make_adapters

from loragate.adapters import AdapterError, LoRARequest
from loragate.adapters.identity import CONFIG_FILE, WEIGHTS_FILE
from loragate.engine import (
    AsyncLLMEngine,
    EngineConfig,
    InFlightRequests,
    LLMEngine,
    SamplingParams,
)

PROMPT = {"prompt_token_ids": [1, 523, 9123, 77, 4051, 300, 12, 881]}
SPECS = {"A": (8, ALL_MODULES, False), "B": (8, ALL_MODULES, False)}


def params(n: int) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=n, min_tokens=n)


@pytest.fixture(scope="module")
def weights(tiny_model_dir, tmp_path_factory):
    model_dir = tiny_model_dir("llama")
    return model_dir, make_adapters(model_dir, tmp_path_factory.mktemp("in-flight"), SPECS)


@pytest.fixture
def engine(weights):
    model_dir, _ = weights
    config = EngineConfig(
        model=str(model_dir),
        max_model_len=128,
        num_kv_blocks=64,
        enable_lora=True,
        max_loras=2,
        max_cpu_loras=2,
        max_lora_rank=8,
    )
    engine = AsyncLLMEngine(LLMEngine(config))
    yield engine
    engine.shutdown()
    assert engine.engine.get_memory_stats()["allocated_blocks"] == 0


def put(source, directory) -> None:
    """Overwrite ``directory``'s files in place (same inodes) with ``source``'s."""
    directory.mkdir(exist_ok=True)
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        data = (source / name).read_bytes()
        with open(directory / name, "wb") as f:
            f.write(data)


async def drain(stream) -> list:
    return [out async for out in stream]


def test_a_request_counts_from_generate_until_it_finishes(engine, weights):
    lora = LoRARequest("a", 1, str(weights[1]["A"]))

    async def scenario():
        assert engine.adapter_in_flight(lora) == 0
        run = asyncio.create_task(drain(engine.generate(PROMPT, params(4), "r1", lora)))
        await asyncio.sleep(0)  # generate ran to its first await: reading the adapter
        assert engine.adapter_in_flight(lora) == 1
        outs = await asyncio.wait_for(run, 60)
        assert outs[-1].finished and len(outs[-1].outputs[0].token_ids) == 4
        assert engine.adapter_in_flight(lora) == 0
        # Weights now in the CPU tier: counted all the same, until the end.
        run = asyncio.create_task(drain(engine.generate(PROMPT, params(4), "r2", lora)))
        await asyncio.sleep(0)
        assert engine.adapter_in_flight(lora) == 1
        await asyncio.wait_for(run, 60)
        assert engine.adapter_in_flight(lora) == 0

    asyncio.run(scenario())


def test_aborted_and_abandoned_requests_end_their_count(engine, weights):
    lora = LoRARequest("a", 1, str(weights[1]["A"]))

    async def scenario():
        stream = engine.generate(PROMPT, params(60), "left", lora)
        await anext(stream)
        assert engine.adapter_in_flight(lora) == 1
        await stream.aclose()  # the caller leaves early: aborted
        assert engine.adapter_in_flight(lora) == 0

        stream = engine.generate(PROMPT, params(60), "aborted", lora)
        await anext(stream)
        await engine.abort("aborted")  # aborted by id: its stream ends
        outs = await asyncio.wait_for(drain(stream), 60)
        assert outs[-1].finished and outs[-1].outputs[0].finish_reason == "abort"
        assert engine.adapter_in_flight(lora) == 0
        await engine.check_integrity()  # after the aborts, on the engine thread

    asyncio.run(scenario())


def test_failed_requests_end_their_count(engine, weights, tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / CONFIG_FILE).write_text("{not json")
    bad = LoRARequest("bad", 2, str(broken))
    good = LoRARequest("a", 1, str(weights[1]["A"]))

    async def scenario():
        stream = engine.generate(PROMPT, params(4), "bad", bad)
        failing = asyncio.create_task(anext(stream))
        await asyncio.sleep(0)
        assert engine.adapter_in_flight(bad) == 1  # counted while its files are read
        with pytest.raises(AdapterError):
            await asyncio.wait_for(failing, 60)
        assert engine.adapter_in_flight(bad) == 0
        # Refused by the engine (a prompt longer than the model's context): not counted on.
        too_long = {"prompt_token_ids": [1] * 200}
        with pytest.raises(ValueError):
            await drain(engine.generate(too_long, params(4), "long", good))
        assert engine.adapter_in_flight(good) == 0

    asyncio.run(scenario())


def test_waiting_for_idle_returns_after_the_last_request_ends(engine, weights):
    lora = LoRARequest("a", 1, str(weights[1]["A"]))
    other = LoRARequest("b", 2, str(weights[1]["B"]))

    async def scenario():
        # None in flight: it returns at once or never (no request will end), so the bound
        # only turns a hang into a failure.
        await asyncio.wait_for(engine.wait_adapter_idle(lora), 60)
        first = engine.generate(PROMPT, params(60), "one", lora)
        second = engine.generate(PROMPT, params(60), "two", lora)
        busy_other = engine.generate(PROMPT, params(60), "three", other)
        await anext(first)
        await anext(second)
        await anext(busy_other)
        waiter = asyncio.create_task(engine.wait_adapter_idle(lora))
        await asyncio.sleep(0.05)
        assert not waiter.done()
        await first.aclose()
        await asyncio.sleep(0.05)
        assert not waiter.done() and engine.adapter_in_flight(lora) == 1
        await second.aclose()
        await asyncio.wait_for(waiter, 5)  # the other adapter's request runs on
        assert engine.adapter_in_flight(other) == 1
        await busy_other.aclose()
        await engine.check_integrity()  # after the aborts, on the engine thread

    asyncio.run(scenario())


def test_waiting_for_idle_covers_a_request_still_reading_its_adapter(engine, weights):
    """Handed over but not yet in the engine (its files on a loader thread): waited for."""
    lora = LoRARequest("a", 1, str(weights[1]["A"]))

    async def scenario():
        run = asyncio.create_task(drain(engine.generate(PROMPT, params(2), "cold", lora)))
        await asyncio.sleep(0)
        await asyncio.wait_for(engine.wait_adapter_idle(lora), 60)
        assert run.done() and (await run)[-1].finished

    asyncio.run(scenario())


def test_the_weights_listener_hears_each_change_once(engine, weights, tmp_path):
    _, paths = weights
    live = tmp_path / "live"
    put(paths["A"], live)
    lora = LoRARequest("live", 1, str(live))
    heard = []

    async def listener(event):
        await asyncio.sleep(0.2)  # the request's first output waits for this
        heard.append(event)

    async def first_output_after_listener(request_id: str) -> tuple[int, str]:
        """How many events were heard when the request's first output came, and the
        weights it was admitted under."""
        stream = engine.generate(PROMPT, params(2), request_id, lora)
        out = await anext(stream)
        heard_then = len(heard)
        await drain(stream)
        return heard_then, out.lora_sha256

    async def scenario():
        stop = engine.on_adapter_weights_changed(listener)
        after, sha_a = await first_output_after_listener("first")
        assert after == 1 and heard[0].sha256 == sha_a and heard[0].previous_sha256 is None
        await first_output_after_listener("same")
        assert len(heard) == 1  # same weights: nothing to tell
        put(paths["B"], live)
        runs = [first_output_after_listener(f"changed-{i}") for i in range(3)]
        results = await asyncio.gather(*runs)
        assert len(heard) == 2, heard  # one change, told once however many requests saw it
        sha_b = results[0][1]
        assert sha_b != sha_a and all(sha == sha_b for _, sha in results)
        assert all(after == 2 for after, _ in results)  # each answered after the listener
        assert (heard[1].sha256, heard[1].previous_sha256) == (sha_b, sha_a)
        assert heard[1].lora_request == lora
        stop()
        put(paths["A"], live)
        await first_output_after_listener("unheard")
        assert len(heard) == 2  # no longer listening

    asyncio.run(scenario())


def test_in_flight_requests_wait_for_the_last_one():
    lora = LoRARequest("a", 1, "/x")

    async def scenario():
        counts = InFlightRequests()
        await counts.wait_idle(lora)  # nobody uses it: returns at once
        counts.started(lora)
        counts.started(lora)
        waiter = asyncio.create_task(counts.wait_idle(lora))
        await asyncio.sleep(0)
        counts.ended(lora)
        await asyncio.sleep(0)
        assert not waiter.done()
        counts.ended(lora)
        await asyncio.wait_for(waiter, 5)
        assert counts.count(lora) == 0
        with pytest.raises(AssertionError):
            counts.ended(lora)  # a request ends once

    asyncio.run(scenario())
