"""The async engine: streaming beside the event loop, aborts, bad input, a dead engine."""

from __future__ import annotations

import asyncio

import pytest
from async_waits_testlib import wait_until

from loragate.engine import LLM, EngineConfig, LLMEngine, SamplingParams
from loragate.engine.api.async_engine import AsyncLLMEngine, EngineDeadError

PARAMS = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
PROMPTS = [{"prompt_token_ids": [1, 10 + i, 20 + i]} for i in range(6)]


async def collect(engine, request_id, prompt, params=PARAMS):
    return [out async for out in engine.generate(prompt, params, request_id)]


async def test_streams_the_same_tokens_as_the_offline_engine(async_engine, tiny_model_dir):
    streams = await asyncio.gather(
        *(collect(async_engine, f"r{i}", p) for i, p in enumerate(PROMPTS))
    )
    offline = LLM(model=str(tiny_model_dir("llama")), max_model_len=128, num_kv_blocks=64)
    expected = offline.generate(PROMPTS, PARAMS, use_tqdm=False)
    for stream, ref in zip(streams, expected, strict=True):
        assert [len(o.outputs[0].token_ids) for o in stream] == list(range(1, 13))
        assert stream[-1].finished and not any(o.finished for o in stream[:-1])
        assert stream[-1].outputs[0].token_ids == ref.outputs[0].token_ids


async def test_leaving_the_stream_early_aborts_and_frees_blocks(async_engine):
    long = SamplingParams(temperature=0, max_tokens=100, ignore_eos=True)
    stream = async_engine.generate(PROMPTS[0], long, "leaver")
    async for out in stream:
        if len(out.outputs[0].token_ids) == 3:
            break
    await stream.aclose()

    async def blocks_freed():
        return (await async_engine.stats()).memory["allocated_blocks"] == 0

    # The engine thread frees them after the abort: a bound on a hang, not a timing.
    await wait_until(blocks_freed, "the leaver's KV blocks to be freed")
    stats = (await async_engine.stats()).memory
    assert stats["allocated_blocks"] == 0
    assert (await async_engine.stats()).unfinished_requests == 0


async def test_bad_input_fails_that_request_only(async_engine):
    ok = asyncio.create_task(collect(async_engine, "fine", PROMPTS[1]))
    with pytest.raises(ValueError, match="prompt is empty"):
        await collect(async_engine, "bad", {"prompt_token_ids": []})
    with pytest.raises(ValueError, match="already in use"):
        first = asyncio.create_task(collect(async_engine, "dup", PROMPTS[2]))
        await asyncio.sleep(0)
        try:
            await collect(async_engine, "dup", PROMPTS[2])
        finally:
            await first
    assert len((await ok)[-1].outputs[0].token_ids) == 12


async def test_dead_engine_fails_waiters_and_new_requests(async_engine):
    def explode():
        raise RuntimeError("device lost")

    async_engine.engine.step_tokens = explode
    with pytest.raises(EngineDeadError, match="device lost"):
        await collect(async_engine, "doomed", PROMPTS[0])
    assert not async_engine.is_running
    with pytest.raises(EngineDeadError):
        await collect(async_engine, "after", PROMPTS[0])
    async_engine.engine.abort_request("doomed")  # let the fixture's leak check pass


def test_a_caller_whose_event_loop_closed_ends_only_its_own_request(tiny_model_dir):
    """A caller that closes its event loop with a stream still open (no abort sent) leaves:
    its request is aborted, and the engine thread goes on serving everyone else."""
    config = EngineConfig(model=str(tiny_model_dir("llama")), max_model_len=128, num_kv_blocks=64)
    engine = AsyncLLMEngine(LLMEngine(config))
    long = SamplingParams(temperature=0, max_tokens=100, ignore_eos=True)

    async def first_tokens():
        stream = engine.generate(PROMPTS[0], long, "gone")
        async for out in stream:
            if len(out.outputs[0].token_ids) == 2:
                return stream  # left open: its loop closes under it

    async def settled():
        async def none_unfinished():
            return (await engine.stats()).unfinished_requests == 0

        # The abort of "gone" runs on the engine thread: a bound on a hang, not a timing.
        await wait_until(none_unfinished, "the abandoned request to be aborted")
        return await engine.stats()

    gone = asyncio.new_event_loop()
    try:
        left_open = gone.run_until_complete(first_tokens())
        gone.close()
        # Bounded: an engine thread that died on the closed loop would leave this hanging.
        served = asyncio.run(asyncio.wait_for(collect(engine, "next", PROMPTS[1]), 60))
        assert len(served[-1].outputs[0].token_ids) == 12
        assert engine.is_running, engine.dead_error
        stats = asyncio.run(settled())
        assert stats.unfinished_requests == 0
        assert stats.memory["allocated_blocks"] == 0
        del left_open
    finally:
        engine.shutdown()
    engine.engine.check_integrity()
