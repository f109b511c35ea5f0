"""Structured output (llguidance, the built-in logits-processor plugin) and logit_bias.

Per request inside mixed batches: two schemas and an unconstrained request on different
adapters in one forward pass, each output valid against its own schema; a constrained
greedy output equals the unconstrained one up to the first token the grammar forbids.
"""

from __future__ import annotations

import json
import re

import jsonschema
import llguidance
import pytest
from structured_testlib import COLOR, POINT
from test_multi_lora import ADAPTERS, requests_for
from tiny_llama import make_adapters

from loragate.engine import SamplingParams
from loragate.engine.sampling.structured_outputs import (
    GuidedDecodingParams,
    StructuredOutputsParams,
)
from loragate.plugins.builtin.structured_output import grammar_of, token_table


@pytest.fixture(scope="module")
def setup(tiny_model_dir, tmp_path_factory):
    model_dir = tiny_model_dir("llama")
    specs = {k: ADAPTERS[k] for k in ("r8-all", "r16-mlp-rslora")}
    return model_dir, requests_for(make_adapters(model_dir, tmp_path_factory.mktemp("a"), specs))


@pytest.fixture(scope="module")
def llm(setup):
    from loragate.engine import LLM

    model_dir, _ = setup
    return LLM(
        model=str(model_dir), max_model_len=256, num_kv_blocks=128, enable_lora=True, max_loras=2
    )


def greedy(n: int = 48, **kwargs) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=n, **kwargs)


def prompt(i: int) -> dict:
    return {"prompt_token_ids": [1] + list(range(300 + 17 * i, 320 + 17 * i))}


def first_forbidden_divergence(llm, spec: dict, constrained: list[int], free: list[int]) -> None:
    """Where the two greedy outputs first differ, the free token must be one the grammar
    forbids there: the mask removes forbidden tokens and nothing else."""
    engine = llm.llm_engine
    tokenizer = token_table(engine.tokenizer, engine.model.vocab_size, engine.eos_token_ids)
    matcher = llguidance.LLMatcher(tokenizer, grammar_of(spec))
    for step, (ours, theirs) in enumerate(zip(constrained, free, strict=False)):
        if ours != theirs:
            assert not matcher.validate_tokens([theirs]), f"step {step}: allowed token masked"
            return
        assert matcher.consume_token(ours)
    raise AssertionError("the grammar changed nothing: this check could not fail")


def test_two_schemas_and_a_free_request_in_one_batch(llm, setup):
    _, loras = setup
    a, b = loras["r8-all"], loras["r16-mlp-rslora"]
    specs = [{"json": COLOR}, {"json": POINT}, None]
    params = [greedy(structured_outputs=s) if s else greedy() for s in specs]
    requests = [a, None, b]
    outs = llm.generate(
        [prompt(i) for i in range(3)], params, lora_request=requests, use_tqdm=False
    )
    for schema, out in zip((COLOR, POINT), outs, strict=False):
        assert out.outputs[0].finish_reason == "stop"
        jsonschema.validate(json.loads(out.outputs[0].text), schema)
    free = llm.generate(
        [prompt(i) for i in range(3)], greedy(), lora_request=requests, use_tqdm=False
    )
    assert outs[2].outputs[0].token_ids == free[2].outputs[0].token_ids
    for i in range(2):
        first_forbidden_divergence(
            llm, specs[i], outs[i].outputs[0].token_ids, free[i].outputs[0].token_ids
        )


def test_regex_choice_grammar_and_json_object(llm):
    cases = [
        ({"regex": "[0-9]{3}-[a-z]{2,5}"}, lambda t: re.fullmatch("[0-9]{3}-[a-z]{2,5}", t)),
        (
            {"choice": ["yes please", "no", 'maybe "so"']},
            lambda t: t in ("yes please", "no", 'maybe "so"'),
        ),
        (
            {"grammar": 'start: "x" DIGIT DIGIT\nDIGIT: /[0-9]/'},
            lambda t: re.fullmatch("x[0-9]{2}", t),
        ),
    ]
    for spec, valid in cases:
        out = llm.generate([prompt(5)], greedy(structured_outputs=spec), use_tqdm=False)[0]
        assert valid(out.outputs[0].text), (spec, out.outputs[0].text)
        assert out.outputs[0].finish_reason == "stop"
    out = llm.generate(
        [prompt(6)], greedy(200, structured_outputs={"json_object": True}), use_tqdm=False
    )[0]
    if out.outputs[0].finish_reason == "stop":
        assert isinstance(json.loads(out.outputs[0].text), dict)
    assert out.outputs[0].text.startswith("{")


def test_samples_and_beams_each_follow_the_grammar(llm):
    spec = StructuredOutputsParams(json=json.dumps(POINT))
    outs = llm.generate(
        [prompt(7)],
        SamplingParams(n=3, temperature=1.0, seed=3, max_tokens=48, structured_outputs=spec),
        use_tqdm=False,
    )[0]
    assert len(outs.outputs) == 3
    for sample in outs.outputs:
        jsonschema.validate(json.loads(sample.text), POINT)
    beams = llm.generate(
        [prompt(8)],
        SamplingParams(
            n=2,
            best_of=3,
            use_beam_search=True,
            temperature=0,
            max_tokens=24,
            guided_decoding=GuidedDecodingParams(choice=["alpha", "beta", "gamma"]),
        ),
        use_tqdm=False,
    )[0]
    assert {o.text for o in beams.outputs} <= {"alpha", "beta", "gamma"}


def test_bad_specs_are_value_errors_naming_the_field(llm):
    with pytest.raises(ValueError, match="exactly one of"):
        SamplingParams(structured_outputs={"regex": "a", "choice": ["b"]})
    with pytest.raises(ValueError, match="not valid JSON"):
        SamplingParams(structured_outputs={"json": "{nope"})
    with pytest.raises(ValueError, match="non-empty strings"):
        SamplingParams(structured_outputs={"choice": ["a", 3]})
    with pytest.raises(ValueError, match="at most"):
        SamplingParams(structured_outputs={"regex": "a" * 70_000})
    with pytest.raises(ValueError, match="structured_outputs cannot be compiled"):
        llm.generate(
            [prompt(1)], greedy(structured_outputs={"grammar": "start: ("}), use_tqdm=False
        )
    with pytest.raises(ValueError, match="not both"):
        SamplingParams(structured_outputs={"regex": "a"}, guided_decoding={"regex": "b"})
    # The engine goes on serving after a refusal.
    assert llm.generate([prompt(1)], greedy(4), use_tqdm=False)[0].outputs[0].token_ids


def test_logit_bias_moves_the_greedy_choice(llm):
    base = llm.generate([prompt(2)], greedy(6), use_tqdm=False)[0].outputs[0].token_ids
    banned = (
        llm.generate([prompt(2)], greedy(6, logit_bias={str(base[0]): -100}), use_tqdm=False)[0]
        .outputs[0]
        .token_ids
    )
    assert banned[0] != base[0]
    forced = llm.generate([prompt(2)], greedy(6, logit_bias={777: 100}), use_tqdm=False)[0]
    assert forced.outputs[0].token_ids == [777] * 6
    with pytest.raises(ValueError, match="outside the vocabulary"):
        llm.generate([prompt(2)], greedy(2, logit_bias={10**6: 1}), use_tqdm=False)
    with pytest.raises(ValueError, match=r"\[-100, 100\]"):
        SamplingParams(logit_bias={5: 101})
    with pytest.raises(ValueError, match="token ids"):
        SamplingParams(logit_bias={"x": 1})
