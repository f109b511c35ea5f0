"""A stream's work per step does not grow with its length (issue 58, must-show 2).

A 2,000-token stream (the tiny model, ignore_eos, greedy, with logprobs) is read as the
gateway reads it: through AsyncLLMEngine.generate in this process, and through a replica's
`generate` (gateway/replicas/engine_replica.py), each item pickled as Ray Serve sends it over
the replica wire. The gateway asks for deltas (`RequestOutputKind.DELTA`), so every output
carries one step's tokens: its token ids, logprobs and pickled bytes stay bounded wherever in
the stream it is, and the deltas grown back (gateway/serving/generation.py's `grown`) are
exactly the cumulative stream's last output. The same measure over the cumulative stream
grows with it (so this test fails on the old path). No clock is read: sizes, not times.
"""

from __future__ import annotations

import asyncio
import pickle
from types import SimpleNamespace

import pytest

from loragate.engine import (
    AsyncLLMEngine,
    EngineConfig,
    EngineRequest,
    LLMEngine,
    RequestOutput,
    RequestOutputKind,
    SamplingParams,
)
from loragate.gateway.replicas.engine_replica import EngineReplica
from loragate.gateway.serving.generation import grown

TOKENS = 2000
PROMPT = "Count on and on:"
# What one step's output may hold beyond its request's fixed fields: one token's id, text
# and logprobs (with the top one), never anything that scales with the stream.
STEP_BYTES = 512


@pytest.fixture(scope="module")
def engine(tiny_dir):
    config = EngineConfig(model=str(tiny_dir), max_model_len=TOKENS + 64, num_kv_blocks=140)
    engine = AsyncLLMEngine(LLMEngine(config))
    yield engine
    engine.shutdown()


def params(kind: RequestOutputKind) -> SamplingParams:
    return SamplingParams(
        temperature=0, max_tokens=TOKENS, ignore_eos=True, logprobs=1, output_kind=kind
    )


async def in_process(engine, kind: RequestOutputKind, request_id: str) -> list[RequestOutput]:
    return [out async for out in engine.generate(PROMPT, params(kind), request_id)]


async def through_replica(engine, request_id: str) -> list[RequestOutput]:
    """What a replica yields for the ingress, each item through pickle as the wire takes it."""
    replica = SimpleNamespace(engine=engine)  # what `generate` uses of the deployment
    call = EngineRequest(PROMPT, params(RequestOutputKind.DELTA), request_id)
    return [
        pickle.loads(pickle.dumps(item)) async for item in EngineReplica.generate(replica, call)
    ]


@pytest.fixture(scope="module")
def streams(engine) -> dict[str, list[RequestOutput]]:
    """The three streams, run side by side (one batch: one stream's time for three)."""

    async def run():
        return await asyncio.gather(
            in_process(engine, RequestOutputKind.CUMULATIVE, "cumulative"),
            in_process(engine, RequestOutputKind.DELTA, "delta"),
            through_replica(engine, "wire"),
        )

    return dict(zip(("cumulative", "delta", "wire"), asyncio.run(run()), strict=True))


def per_step(outputs: list[RequestOutput]) -> tuple[list[int], list[int]]:
    """Each output's token ids and pickled bytes."""
    tokens = [len(out.outputs[0].token_ids) for out in outputs]
    return tokens, [len(pickle.dumps(out)) for out in outputs]


def assert_bounded(outputs: list[RequestOutput]) -> None:
    tokens, sizes = per_step(outputs)
    assert sum(tokens) == TOKENS and outputs[-1].finished
    assert max(tokens) <= 1  # one step's token, no more: nothing is sent twice
    assert max(sizes) <= min(sizes) + STEP_BYTES, (min(sizes), max(sizes))
    late = sizes[-len(sizes) // 4 :]
    assert max(late) <= max(sizes[: len(sizes) // 4]) + STEP_BYTES // 4


def whole(outputs: list[RequestOutput]) -> RequestOutput:
    total = None
    for out in outputs:
        total = grown(total, out)
    return total


def same_answer(got: RequestOutput, want: RequestOutput) -> None:
    """The same tokens, text and logprob entries; the logprobs' values up to float32 rounding.

    The streams are other rows of one batch, not the same row: where the CPU's matmul
    splits a batch's rows among micro-kernels (seen on an AVX2-only EPYC: a 3-row batch's
    third row takes another kernel than the first two), a row's sums round differently by
    its place in the batch, so its logprobs may differ in their last bits."""
    g, w = got.outputs[0], want.outputs[0]
    assert (g.text, g.token_ids, g.finish_reason) == (w.text, w.token_ids, w.finish_reason)
    assert [sorted(step) for step in g.logprobs] == [sorted(step) for step in w.logprobs]
    for mine, theirs in zip(g.logprobs, w.logprobs, strict=True):
        for token, value in mine.items():
            assert value == pytest.approx(theirs[token], rel=1e-4, abs=1e-5)
    assert g.cumulative_logprob == pytest.approx(w.cumulative_logprob, rel=1e-4)
    assert got.prompt_token_ids == want.prompt_token_ids and got.finished


def test_the_cumulative_stream_grows_with_its_length(streams):
    """The measure sees the old path's growth: its last output holds every token."""
    tokens, sizes = per_step(streams["cumulative"])
    assert tokens[-1] == TOKENS
    assert sizes[-1] > sizes[0] + TOKENS * 8


def test_in_process_deltas_stay_bounded(streams):
    assert_bounded(streams["delta"])
    same_answer(whole(streams["delta"]), streams["cumulative"][-1])


def test_replica_wire_deltas_stay_bounded(streams):
    assert_bounded(streams["wire"])
    same_answer(whole(streams["wire"]), streams["cumulative"][-1])


def both_kinds(engine, request_id: str, **fields) -> tuple[RequestOutput, RequestOutput]:
    """One request's last cumulative output, and its deltas grown back as the gateway does."""

    async def run(kind):
        p = SamplingParams(output_kind=kind, **fields)
        return [out async for out in engine.generate(PROMPT, p, f"{request_id}-{kind.name}")]

    return asyncio.run(run(RequestOutputKind.CUMULATIVE))[-1], whole(
        asyncio.run(run(RequestOutputKind.DELTA))
    )


def same_samples(got: list, want: list) -> None:
    def seen(c):
        return (c.index, c.text, c.token_ids, c.logprobs, c.cumulative_logprob, c.finish_reason)

    assert [seen(c) for c in got] == [seen(c) for c in want]


@pytest.mark.parametrize(
    "fields",
    [
        {"n": 2, "best_of": 3, "seed": 7, "logprobs": 2, "max_tokens": 12},
        {"n": 3, "seed": 3, "max_tokens": 9, "logprobs": 0},
        {"use_beam_search": True, "n": 2, "best_of": 2, "temperature": 0, "max_tokens": 6},
    ],
    ids=["best_of", "n", "beam_search"],
)
def test_deltas_grow_back_into_the_cumulative_answer(engine, fields):
    """n > 1, best_of (the kept n named at the end, the others in best_of_sequences) and beam
    search: the deltas grown back are the cumulative answer, sample for sample."""
    want, got = both_kinds(engine, "kinds", **fields)
    same_samples(got.outputs, want.outputs)
    same_samples(got.best_of_sequences or [], want.best_of_sequences or [])
    assert (got.best_of_sequences is None) == (want.best_of_sequences is None)


def test_text_held_back_for_a_stop_string_is_sent_once(engine):
    """A stop string from the middle of a greedy answer: the deltas never send text the stop
    string then cuts, and add up to the cumulative answer."""
    (free,) = both_kinds(engine, "free", temperature=0, max_tokens=24)[0].outputs
    stop = free.text[len(free.text) // 2 :][:4]
    want, got = both_kinds(engine, "stop", temperature=0, max_tokens=24, stop=[stop])
    same_samples(got.outputs, want.outputs)
    assert got.outputs[0].finish_reason == "stop" and stop not in got.outputs[0].text


def test_prompt_logprobs_come_once(engine):
    """Under DELTA the prompt's logprobs are in one output (the first that has them), and
    grown back they are the cumulative answer's."""
    fields = {"temperature": 0, "max_tokens": 8, "prompt_logprobs": 2}

    async def run():
        p = SamplingParams(output_kind=RequestOutputKind.DELTA, **fields)
        return [out async for out in engine.generate(PROMPT, p, "prompt-logprobs")]

    deltas = asyncio.run(run())
    assert len([out for out in deltas if out.prompt_logprobs is not None]) == 1
    want, got = both_kinds(engine, "prompt-logprobs-both", **fields)
    assert got.prompt_logprobs == want.prompt_logprobs and want.prompt_logprobs is not None
    same_samples(got.outputs, want.outputs)


def test_final_only_answers_once_whole(engine):
    async def run(kind):
        p = SamplingParams(temperature=0, max_tokens=10, logprobs=1, output_kind=kind)
        return [out async for out in engine.generate(PROMPT, p, f"final-{kind.name}")]

    (final,) = asyncio.run(run(RequestOutputKind.FINAL_ONLY))
    same_samples(final.outputs, asyncio.run(run(RequestOutputKind.CUMULATIVE))[-1].outputs)
    assert final.finished
