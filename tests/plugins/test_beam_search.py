"""The "beam" strategy equals HF transformers' beam search, token for token, in float32."""

from __future__ import annotations

import copy

import pytest
import torch
from beam_testlib import drive_beam_search, hf_beam_search
from tiny_llama import hf_init_tiny_model

from loragate.plugins import PluginManager
from loragate.plugins.builtin.beam_search import BeamSearch

PROMPT = [5, 9, 13, 2, 40]
MAX_TOKENS = 12
# A token the tiny model below emits often (its greedy output repeats it), so hypotheses
# finish at many lengths; coverage checks below keep that true.
EOS = 34
OTHER_EOS = 47


@pytest.fixture(scope="module")
def tiny_model():
    model = hf_init_tiny_model(seed=0, vocab_size=64, hidden_size=32, intermediate_size=64)
    with torch.no_grad():  # peakier distributions: beams finish at different lengths
        model.lm_head.weight.mul_(3.0)
    return model


def beam_params(width, n=None, length_penalty=1.0, early_stopping=False, min_tokens=0):
    return {
        "best_of": width,
        "n": n or width,
        "length_penalty": length_penalty,
        "early_stopping": early_stopping,
        "min_tokens": min_tokens,
    }


CASES = [
    beam_params(width, length_penalty=lp, early_stopping=es)
    for width in (2, 4)
    for lp in (1.0, 0.5, 2.0)
    for es in (True, False, "never")
]


@pytest.fixture(scope="module")
def hf_results(tiny_model):
    return [hf_beam_search(tiny_model, PROMPT, p, [EOS], MAX_TOKENS) for p in CASES]


@pytest.mark.parametrize("case", range(len(CASES)), ids=lambda i: _case_id(CASES[i]))
def test_matches_hf_beam_search(tiny_model, hf_results, case):
    ours = drive_beam_search(tiny_model, PROMPT, CASES[case], {EOS}, MAX_TOKENS)
    theirs = hf_results[case]
    assert [tokens for tokens, _ in ours] == [tokens for tokens, _ in theirs]
    for (_, our_score), (_, their_score) in zip(ours, theirs, strict=True):
        assert our_score == pytest.approx(their_score, abs=1e-6, rel=0)


def test_cases_exercise_finished_hypotheses_and_every_early_stopping_mode(hf_results):
    """Guards the model choice: without this the comparison could pass vacuously."""
    finished = [tokens for result in hf_results for tokens, _ in result]
    assert any(t[-1] == EOS and len(t) < MAX_TOKENS for t in finished)  # finished early
    assert any(t[-1] != EOS and len(t) == MAX_TOKENS for t in finished)  # cut at max_tokens
    by_mode = {}
    for params, result in zip(CASES, hf_results, strict=True):
        key = (params["best_of"], params["length_penalty"])
        by_mode.setdefault(key, {})[params["early_stopping"]] = result
    assert any(modes[True] != modes[False] for modes in by_mode.values())
    assert any(modes[False] != modes["never"] for modes in by_mode.values())


@pytest.fixture(scope="module")
def eos_loving_model(tiny_model):
    """The tiny model with a +1 logit bias on both EOS ids: often every best candidate of
    every beam is an EOS (so K = (1 + #EOS) * W candidates matter), and min_tokens is what
    stops one."""
    model = copy.deepcopy(tiny_model)
    head = torch.nn.Linear(model.config.hidden_size, model.config.vocab_size, bias=True)
    with torch.no_grad():
        head.weight.copy_(model.lm_head.weight)
        head.bias.zero_()
        head.bias[[EOS, OTHER_EOS]] = 1.0
    model.lm_head = head
    return model


@pytest.mark.parametrize(
    ("params", "eos"),
    [
        (beam_params(2, early_stopping="never"), [EOS, OTHER_EOS]),
        (beam_params(2, early_stopping="never", min_tokens=2), [EOS, OTHER_EOS]),
        (beam_params(3, early_stopping="never", min_tokens=2), [EOS, OTHER_EOS]),
        (beam_params(3, early_stopping=False, min_tokens=2), [EOS, OTHER_EOS]),
        (beam_params(4, early_stopping=True, min_tokens=4), [EOS]),
        (beam_params(4, early_stopping=False, min_tokens=3), [OTHER_EOS]),
    ],
    ids=["W2-never", "W2-never-min2", "W3-never-min2", "W3-min2", "W4-min4", "W4-min3"],
)
def test_matches_hf_when_eos_is_the_favourite(eos_loving_model, params, eos):
    theirs = hf_beam_search(eos_loving_model, PROMPT, params, eos, MAX_TOKENS)
    ours = drive_beam_search(eos_loving_model, PROMPT, params, set(eos), MAX_TOKENS)
    assert all(len(tokens) > params["min_tokens"] for tokens, _ in ours)
    assert [tokens for tokens, _ in ours] == [tokens for tokens, _ in theirs]
    for (_, our_score), (_, their_score) in zip(ours, theirs, strict=True):
        assert our_score == pytest.approx(their_score, abs=1e-6, rel=0)


@pytest.mark.parametrize(
    ("params", "eos"),
    [
        (beam_params(4, n=2, length_penalty=1.0, early_stopping=False), [EOS]),
        (beam_params(4, n=1, length_penalty=0.5, early_stopping=True), [EOS]),
        (beam_params(4, length_penalty=1.0, early_stopping=True, min_tokens=4), [EOS]),
        (beam_params(2, length_penalty=1.0, early_stopping=False), [EOS, OTHER_EOS]),
        (beam_params(3, length_penalty=0.0, early_stopping="never"), [EOS, OTHER_EOS]),
        (beam_params(4, length_penalty=-1.0, early_stopping="never"), [EOS]),
        (beam_params(4, length_penalty=1.0, early_stopping=False), []),
    ],
    ids=["n2", "n1", "min_tokens", "two_eos", "width3-lp0", "negative-lp", "no-eos"],
)
def test_matches_hf_for_n_min_tokens_and_eos_sets(tiny_model, params, eos):
    eos_for_hf = eos or [0]  # HF needs some EOS id; 0 must then never be emitted
    theirs = hf_beam_search(tiny_model, PROMPT, params, eos_for_hf, MAX_TOKENS)
    ours = drive_beam_search(tiny_model, PROMPT, params, set(eos), MAX_TOKENS)
    if not eos:
        assert all(0 not in tokens for tokens, _ in theirs)
    if params["min_tokens"]:
        assert all(len(tokens) >= params["min_tokens"] for tokens, _ in ours)
    assert [tokens for tokens, _ in ours] == [tokens for tokens, _ in theirs]
    for (_, our_score), (_, their_score) in zip(ours, theirs, strict=True):
        assert our_score == pytest.approx(their_score, abs=1e-6, rel=0)


def test_matches_hf_with_its_kv_cache(tiny_model):
    """HF's default (cached) generate differs only by float noise in the logits."""
    for params in (beam_params(4, length_penalty=1.0), beam_params(2, early_stopping=True)):
        theirs = hf_beam_search(tiny_model, PROMPT, params, [EOS], MAX_TOKENS, use_cache=True)
        ours = drive_beam_search(tiny_model, PROMPT, params, {EOS}, MAX_TOKENS)
        assert [tokens for tokens, _ in ours] == [tokens for tokens, _ in theirs]
        for (_, our_score), (_, their_score) in zip(ours, theirs, strict=True):
            assert our_score == pytest.approx(their_score, abs=1e-5, rel=0)


@pytest.mark.slow
def test_matches_hf_on_the_default_model_chat_prompt():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from loragate.engine.loading.model_loader import resolve_model

    # The converted folder: the GGUF's weights bit-equal, read without transformers
    # dequantizing the file and converting its vocabulary again (seconds to a minute).
    hf_dir = resolve_model(None).hf_dir
    tokenizer = AutoTokenizer.from_pretrained(hf_dir)
    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    messages = [{"role": "user", "content": "Name three primary colors."}]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    params = beam_params(4, length_penalty=1.0, early_stopping=False)
    eos = tokenizer.eos_token_id
    theirs = hf_beam_search(model, prompt, params, [eos], 24, use_cache=True)
    ours = drive_beam_search(model, prompt, params, {eos}, 24)
    assert [tokens for tokens, _ in ours] == [tokens for tokens, _ in theirs]
    for (_, our_score), (_, their_score) in zip(ours, theirs, strict=True):
        assert our_score == pytest.approx(their_score, abs=1e-5, rel=0)


# -- the strategy's own contract ----------------------------------------------------------


def test_manager_offers_beam_as_a_builtin_strategy():
    plugins = PluginManager.create(load_entrypoints=False)
    plugin_name, strategy = plugins.decoding_strategy("beam")
    assert plugin_name == "builtin.beam_search" and isinstance(strategy, BeamSearch)
    with pytest.raises(ValueError, match=r"unknown decoding strategy 'bam'.*\['beam'\]"):
        plugins.decoding_strategy("bam")


def test_first_step_takes_the_prompt_then_width_rows():
    strategy = BeamSearch()
    state = strategy.start(beam_params(3), {0}, 5)
    assert state.num_running == 1
    logprobs = torch.log_softmax(torch.arange(8, dtype=torch.float32), dim=-1)
    decision = strategy.step(state, logprobs[None, :])
    assert decision.parents == [0, 0, 0] and decision.tokens == [7, 6, 5] and not decision.done
    assert state.num_running == 3
    with pytest.raises(ValueError, match=r"logprobs must be \[3, vocab\]"):
        strategy.step(state, logprobs[None, :])


def test_max_tokens_ends_the_search_and_finish_needs_it():
    strategy = BeamSearch()
    state = strategy.start(beam_params(2), set(), 2)
    first = torch.log_softmax(torch.tensor([[0.0, 1.0, 2.0, 3.0, 4.0]]), dim=-1)
    decision = strategy.step(state, first)
    assert decision.tokens == [4, 3]
    with pytest.raises(ValueError, match="not done yet"):
        strategy.finish(state)
    second = torch.log_softmax(torch.tensor([[0.0, 1.0, 2.0, 3.0, 4.0], [0, 0, 0, 0, 9.0]]), -1)
    decision = strategy.step(state, second)
    assert decision.done and decision.parents == [] and state.num_running == 0
    with pytest.raises(ValueError, match="beam search is done"):
        strategy.step(state, second)
    best, runner_up = strategy.finish(state)
    assert best.token_ids == [4, 4] and runner_up.token_ids == [3, 4]
    # length_penalty 1: the summed log-probability over the 2 generated tokens
    assert best.score == pytest.approx(float(first[0, 4] + second[0, 4]) / 2, abs=1e-6)
    assert runner_up.score == pytest.approx(float(first[0, 3] + second[1, 4]) / 2, abs=1e-6)


@pytest.mark.parametrize(
    ("params", "eos", "max_tokens", "message"),
    [
        (beam_params(2, n=3), {0}, 4, r"n \(3\) must be <= best_of"),
        ({**beam_params(2), "best_of": 0}, {0}, 4, "best_of"),
        (beam_params(2, early_stopping="sometimes"), {0}, 4, "early_stopping"),
        (beam_params(2, length_penalty="long"), {0}, 4, "length_penalty"),
        (beam_params(2, min_tokens=-1), {0}, 4, "min_tokens"),
        (beam_params(2), {0}, 0, "max_tokens"),
        (beam_params(2), {-3}, 4, "eos_token_ids"),
    ],
)
def test_bad_parameters_are_value_errors(params, eos, max_tokens, message):
    with pytest.raises(ValueError, match=message):
        BeamSearch().start(params, eos, max_tokens)


def test_vocab_smaller_than_the_candidates_is_a_value_error():
    state = BeamSearch().start(beam_params(4), {0}, 4)
    with pytest.raises(ValueError, match="smaller than the 8 beam candidates"):
        BeamSearch().step(state, torch.zeros(1, 5))


def _case_id(params) -> str:
    return f"W{params['best_of']}-lp{params['length_penalty']}-es{params['early_stopping']}"
