"""Output handling beside the step (issue 36): detokenizing, stop strings and streamed
outputs run on the output thread, and what callers see is what the step thread built before:
the same text at every step, the same token ids (none after a stop string), the same finish
and stop reasons, with characters split over tokens, stop strings spanning tokens,
include_stop_str_in_output, EOS, best_of, n > 1 and logprobs.

The tokens come from a scripted sampler (the model's logits are ignored), so every case is
known to happen: each sample emits its own script, whatever shares the batch."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass

import pytest
from async_waits_testlib import wait_until

from loragate.engine import EngineConfig, LLMEngine, RequestOutputKind, SamplingParams
from loragate.engine.api.async_engine import AsyncLLMEngine
from loragate.engine.core.sequence import sample_generator
from loragate.engine.outputs.detokenizer import IncrementalDetokenizer
from loragate.engine.outputs.stopping import stop_by_text, stop_by_token, stream_safe_len
from loragate.engine.sampling.sampler import SampleResult

MAX_MODEL_LEN = 256
FILLER = " and then some more words that nobody reads" * 4
TEXTS = [
    "Héllo wörld 👋 — 日本語 is fun; the END is near, really.",
    "Ünïcödé 🎉🎉 party STOP-now and more text after.",
    "plain ascii text with a stop ## marker here and beyond",
]
PROMPTS = [[1, 200 + i, 300 + i, 400 + i] for i in range(8)]


@dataclass
class Case:
    """One request: its prompt, params, and each sample's script (text, or token ids)."""

    name: str
    prompt: list[int]
    params: SamplingParams
    scripts: list


def cases(eos: int) -> list[Case]:
    return [
        Case("spanning", PROMPTS[0], SamplingParams(max_tokens=60, stop=["語 is"]), [TEXTS[0]]),
        Case(
            "kept_with_logprobs",
            PROMPTS[1],
            SamplingParams(
                max_tokens=60, stop=["wörld 👋"], include_stop_str_in_output=True, logprobs=2
            ),
            [TEXTS[0]],
        ),
        Case(
            "best_of",
            PROMPTS[2],
            SamplingParams(n=2, best_of=3, seed=7, max_tokens=60, stop=["END", "🎉 p", " ##"]),
            list(TEXTS),
        ),
        Case(
            "n3_eos_and_length",
            PROMPTS[3],
            SamplingParams(n=3, seed=11, max_tokens=9, stop=["ascii textual", "🎉 p"]),
            [TEXTS[2], TEXTS[1], ("ends here", eos)],
        ),
        Case(
            "held_back_then_released",
            PROMPTS[4],
            SamplingParams(max_tokens=4, stop=["ascii textual"]),
            [TEXTS[2]],
        ),
        Case("emoji_stop", PROMPTS[5], SamplingParams(max_tokens=60, stop=["👋"]), [TEXTS[0]]),
    ]


def script_ids(tokenizer, script) -> list[int]:
    if isinstance(script, tuple):  # (text, a token id after it)
        text, token = script
        return (
            tokenizer.encode(text, add_special_tokens=False) + [token] + script_ids(tokenizer, "x")
        )
    return tokenizer.encode(script + FILLER, add_special_tokens=False)


class ScriptedSampler:
    """Each sample's next token is its script's; its logprob is -(sample index + 1) / 10 for
    every token (best_of orders by it)."""

    def __init__(self, tokenizer, all_cases: list[Case]):
        self.scripts = {}
        for case in all_cases:
            for index, script in enumerate(case.scripts):
                generator = sample_generator(case.params.seed, index)
                key = (tuple(case.prompt), generator.initial_seed() if generator else None)
                self.scripts[key] = (index, script_ids(tokenizer, script))

    def __call__(self, logits, rows) -> list[SampleResult]:
        results = []
        for row in rows:
            seed = row.generator.initial_seed() if row.generator is not None else None
            index, script = self.scripts[(tuple(row.prompt_token_ids), seed)]
            token = script[len(row.output_token_ids)]
            logprob = -(index + 1) / 10 if row.params.scores_tokens else None
            top = {token: logprob} if row.params.logprobs is not None else None
            results.append(SampleResult(token, logprob, top))
        return results


def expected_stream(tokenizer, case: Case, eos_ids) -> list[list[tuple]]:
    """What the step thread streamed before output handling moved off it: after each step,
    every sample's (text, token ids, finish_reason, stop_reason, cumulative logprob)."""
    params = case.params
    scripts = [script_ids(tokenizer, s) for s in case.scripts]
    samples = []
    for _ in scripts:
        detok = IncrementalDetokenizer(
            tokenizer, case.prompt, skip_special_tokens=params.skip_special_tokens
        )
        cumulative = 0.0 if params.scores_tokens else None
        samples.append({"detok": detok, "ids": [], "text": "", "end": None, "cum": cumulative})
    steps = []
    while not all(s["end"] for s in samples):
        for index, (s, script) in enumerate(zip(samples, scripts, strict=True)):
            if s["end"]:
                continue
            token = script[len(s["ids"])]
            s["ids"].append(token)
            if s["cum"] is not None:
                s["cum"] += -(index + 1) / 10
            delta = s["detok"].step([token])
            s["text"] += delta
            by_token = stop_by_token(params, len(s["ids"]), token, eos_ids)
            decision = stop_by_text(params, len(s["ids"]), s["text"], len(delta), by_token)
            if decision is not None:
                s["text"] += s["detok"].flush()
                if decision.truncate_to is not None:
                    s["text"] = s["text"][: decision.truncate_to]
                s["end"] = (decision.finish_reason, decision.stop_reason)
        step = []
        for s in samples:
            text = s["text"] if s["end"] else s["text"][: stream_safe_len(s["text"], params)]
            reason, stop = s["end"] or (None, None)
            step.append((text, list(s["ids"]), reason, stop, s["cum"]))
        steps.append(step)
    return steps


def seen(out) -> list[tuple]:
    return [
        (c.text, c.token_ids, c.finish_reason, c.stop_reason, c.cumulative_logprob)
        for c in out.outputs
    ]


def final_expected(case: Case, step: list[tuple]) -> list[tuple]:
    """The finished output: best_of keeps the n likeliest (stable for ties)."""
    n = case.params.n
    if len(step) > n:
        step = sorted(step, key=lambda s: s[4], reverse=True)
    return step[:n]


@pytest.fixture
def scripted(tiny_model_dir):
    config = EngineConfig(
        model=str(tiny_model_dir("llama")), max_model_len=MAX_MODEL_LEN, num_kv_blocks=128
    )
    engine = LLMEngine(config)
    all_cases = cases(min(engine.eos_token_ids))
    engine.dispatcher.sampler = ScriptedSampler(engine.tokenizer, all_cases)
    return engine, all_cases


def test_the_scripts_have_what_the_cases_need(scripted):
    engine, all_cases = scripted
    tok = engine.tokenizer
    ids = script_ids(tok, TEXTS[0])
    pieces = [tok.decode([i]) for i in ids]
    assert any("\ufffd" in p for p in pieces), "a character should be split over tokens"
    spans = ["語 is", "🎉 p", "wörld 👋"]
    for stop in spans:  # no single token holds it
        assert not any(
            stop in p for p in pieces + [tok.decode([i]) for i in script_ids(tok, TEXTS[1])]
        )
    assert len(all_cases) == 6


async def test_streamed_text_and_stops_equal_the_step_threads(scripted, monkeypatch):
    engine, all_cases = scripted
    threads: set[str] = set()
    step, flush = IncrementalDetokenizer.step, IncrementalDetokenizer.flush

    def step_here(self, token_ids):
        threads.add(threading.current_thread().name)
        return step(self, token_ids)

    def flush_here(self):
        threads.add(threading.current_thread().name)
        return flush(self)

    monkeypatch.setattr(IncrementalDetokenizer, "step", step_here)
    monkeypatch.setattr(IncrementalDetokenizer, "flush", flush_here)
    served = AsyncLLMEngine(engine)
    try:

        async def stream(case: Case):
            prompt = {"prompt_token_ids": case.prompt}
            return [out async for out in served.generate(prompt, case.params, case.name)]

        streams = await asyncio.gather(*(stream(c) for c in all_cases))

        async def settled():
            stats = await served.stats()
            return stats.memory["allocated_blocks"] == 0 and stats.unfinished_requests == 0

        # Stop strings' samples are freed by the engine thread: a bound on a hang, not a timing.
        await wait_until(settled, "every block freed and no request unfinished")
        stats = await served.stats()
        assert stats.memory["allocated_blocks"] == 0 and stats.unfinished_requests == 0
    finally:
        served.shutdown()
    # Detokenizing ran beside the engine thread, never on it.
    assert threads == {"loragate-output"}, threads
    assert len(engine.output_processor) == 0  # it keeps nothing of a finished request
    eos = engine.eos_token_ids
    kept = 0
    for case, outs in zip(all_cases, streams, strict=True):
        want = expected_stream(engine.tokenizer, case, eos)
        n = case.params.n
        assert len(outs) == len(want), case.name
        for out, step_want in zip(outs[:-1], want[:-1], strict=True):
            assert not out.finished
            assert seen(out) == step_want[:n], case.name
        assert outs[-1].finished
        assert seen(outs[-1]) == final_expected(case, want[-1]), case.name
        for c in outs[-1].outputs:  # the text is what the tokens decode to, cut at the stop
            full = engine.tokenizer.decode(
                c.token_ids, skip_special_tokens=True, clean_up_tokenization_spaces=False
            )
            if isinstance(c.stop_reason, str) and not case.params.include_stop_str_in_output:
                assert full.startswith(c.text) and full[len(c.text) :].startswith(c.stop_reason)
            else:
                assert c.text == full, case.name
        kept += sum(len(s[1]) for s in want[-1])
    # A sample stopped by a stop string runs a step or two past it, not to max_tokens.
    stopped = sum(len(c.scripts) for c in all_cases)
    assert kept <= engine.num_generation_tokens <= kept + 2 * stopped


def test_the_offline_engine_streams_the_same(scripted):
    """The offline engine runs the same output processing inline after each step."""
    engine, all_cases = scripted
    for case in all_cases:
        engine.add_request(case.name, {"prompt_token_ids": case.prompt}, case.params)
    streams: dict[str, list] = {case.name: [] for case in all_cases}
    while engine.has_unfinished_requests():
        for out in engine.step():
            streams[out.request_id].append(out)
    for case in all_cases:
        want = expected_stream(engine.tokenizer, case, engine.eos_token_ids)
        outs = streams[case.name]
        assert [seen(o) for o in outs[:-1]] == [w[: case.params.n] for w in want[:-1]]
        assert outs[-1].finished and seen(outs[-1]) == final_expected(case, want[-1])
    assert engine.get_memory_stats()["allocated_blocks"] == 0
    assert len(engine.output_processor) == 0


def test_llm_generate_answers_whole_whatever_the_output_kind(make_llm, tiny_model_dir):
    """As vLLM's LLM.generate: only the final output is built (FINAL_ONLY), so it is whole
    even for params that ask for deltas, and the caller's params stay as given."""
    llm = make_llm(model=str(tiny_model_dir("llama")), max_model_len=128, num_kv_blocks=64)
    greedy = {"temperature": 0, "max_tokens": 12, "logprobs": 1}
    asked = SamplingParams(output_kind=RequestOutputKind.DELTA, **greedy)
    (got,) = llm.generate(["Hello there"], asked, use_tqdm=False)
    (want,) = llm.generate(["Hello there"], SamplingParams(**greedy), use_tqdm=False)
    assert len(got.outputs[0].token_ids) == 12 and got.outputs == want.outputs
    assert asked.output_kind == RequestOutputKind.DELTA
