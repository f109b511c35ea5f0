"""Speculative decoding beside the engine's other request features (issue 61): on the default
model, prompts that repeat themselves (proposals accepted) with stop strings, logprobs,
n > 1 (seeded sampling), beam search (which does not speculate) and a shared prefix (prefix
caching) give the same outputs with prompt lookup as without it: tokens, texts, finish
reasons and stop reasons equal, logprobs equal to float32 rounding."""

from __future__ import annotations

import math

from loragate.engine import SamplingParams

SPEC = {"method": "ngram", "num_speculative_tokens": 4}
TEXT = "one two three four five six seven eight nine ten. one two three four five six seven"
REQUESTS = [
    (TEXT, SamplingParams(temperature=0, max_tokens=30, stop=["nine ten"])),
    (TEXT + " eight", SamplingParams(temperature=0, max_tokens=24, logprobs=3)),
    (TEXT, SamplingParams(temperature=0.8, top_p=0.9, n=3, seed=7, max_tokens=24)),
    (TEXT + " eight nine", SamplingParams(temperature=0, max_tokens=20, stop=["ten"])),
    ("Apples and pears. " + TEXT, SamplingParams(temperature=0, max_tokens=24, logprobs=1)),
]
BEAM = SamplingParams(use_beam_search=True, n=2, max_tokens=12, temperature=0)


def outputs(llm, prompts):
    got = []
    for text, params in prompts:
        out = llm.generate(text, params, use_tqdm=False)[0]
        got.append(
            [(o.token_ids, o.text, o.finish_reason, o.stop_reason, o.logprobs) for o in out.outputs]
        )
    return got


def same_logprobs(a, b) -> bool:
    if a is None or b is None:
        return a is b
    return all(
        x.keys() == y.keys() and all(math.isclose(x[t], y[t], abs_tol=1e-4) for t in x)
        for x, y in zip(a, b, strict=True)
    )


def test_stop_strings_logprobs_n_beams_and_prefix_caching_with_speculation(make_llm):
    runs = {}
    for spec in (None, SPEC):
        llm = make_llm(
            dtype="float32",
            max_model_len=256,
            max_num_batched_tokens=256,
            enable_prefix_caching=True,
            speculative_config=spec,
        )
        runs[spec is not None] = outputs(llm, [*REQUESTS, (TEXT, BEAM)])
    for i, (with_spec, without) in enumerate(zip(runs[True], runs[False], strict=True)):
        assert len(with_spec) == len(without)
        for a, b in zip(with_spec, without, strict=True):
            assert a[:4] == b[:4], f"request {i}"
            assert same_logprobs(a[4], b[4]), f"request {i}"
    assert runs[True][0][0][2] == "stop" and runs[True][3][0][2] == "stop"
    stats = llm.engine.scheduler.speculator.stats()[0]
    assert stats["accepted_tokens"] > 10, stats
    assert llm.engine.get_memory_stats()["prefix_cache_hit_tokens"] > 0
