"""`AsyncLLMEngine.abort` answers the request's waiting stream, as vLLM's AsyncLLM does.

A caller still iterating `generate` when someone aborts its request gets one last output,
finished with "abort" and holding the tokens it had, and its loop ends; before this, the
stream was dropped and the caller waited forever. Other requests are untouched and every
KV block comes back.
"""

from __future__ import annotations

import asyncio

from async_waits_testlib import wait_until

from loragate.engine import SamplingParams

LONG = SamplingParams(temperature=0, max_tokens=100, ignore_eos=True)
SHORT = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


async def test_an_aborted_request_ends_its_waiting_stream(async_engine):
    seen = []

    async def follow(request_id, params):
        async for out in async_engine.generate({"prompt_token_ids": [1, 5, 9]}, params, request_id):
            seen.append((request_id, out))
        return out

    doomed = asyncio.create_task(follow("doomed", LONG))
    other = asyncio.create_task(follow("other", SHORT))
    # Bounded, so a stream that never gets there fails instead of hanging: a guard, not a
    # timing (the time to three tokens is not what this test is about).
    await wait_until(
        lambda: any(rid == "doomed" and len(o.outputs[0].token_ids) >= 3 for rid, o in seen),
        "three tokens streamed to the doomed request",
        every=0.005,  # unchanged: the abort must land well before its 100 tokens end
    )
    await async_engine.abort("doomed")

    last = await asyncio.wait_for(doomed, timeout=30)
    assert last.finished and last.outputs[0].finish_reason == "abort"
    streamed = [o for rid, o in seen if rid == "doomed"]
    assert not any(o.finished for o in streamed[:-1]) and streamed[-1] is last
    assert 3 <= len(last.outputs[0].token_ids) < LONG.max_tokens
    assert last.outputs[0].token_ids[:3] == streamed[2].outputs[0].token_ids

    done = await asyncio.wait_for(other, timeout=30)
    assert done.outputs[0].finish_reason == "length" and len(done.outputs[0].token_ids) == 12

    async def none_unfinished():
        return (await async_engine.stats()).unfinished_requests == 0

    # The engine thread ends the aborted request: a bound on a hang, not a timing.
    await wait_until(none_unfinished, "no unfinished request in the engine")
    assert async_engine.num_requests == 0, "no stream is left behind"


async def test_aborting_a_finished_or_unknown_request_changes_nothing(async_engine):
    outs = [o async for o in async_engine.generate({"prompt_token_ids": [1, 2]}, SHORT, "done")]
    assert outs[-1].finished and outs[-1].outputs[0].finish_reason == "length"
    await async_engine.abort("done")
    await async_engine.abort("never-sent")
    again = [o async for o in async_engine.generate({"prompt_token_ids": [1, 2]}, SHORT, "done")]
    assert again[-1].outputs[0].token_ids == outs[-1].outputs[0].token_ids
    assert async_engine.num_requests == 0
