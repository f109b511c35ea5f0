"""Beam search as the seed writes it (any temperature, top_k) and vLLM's LLM.beam_search.

Temperature scales the beam scores as vLLM's LLM.beam_search does: the beams are ranked by
log_softmax(logits / T) (T = 0 meaning 1). HF's beam search with a logits processor that
turns its log-probabilities into log_softmax(logits / T) is the reference.
"""

from __future__ import annotations

import logging

import pytest
import torch
from transformers import AutoModelForCausalLM, LogitsProcessor, LogitsProcessorList

from loragate.engine import BeamSearchParams, SamplingParams
from loragate.engine.sampling import sampling_params as sampling_params_module

PROMPT = [1, 50, 60, 70, 80, 90, 100]


class ScaledLogprobs(LogitsProcessor):
    """log_softmax(log_softmax(l) / T) == log_softmax(l / T)."""

    def __init__(self, temperature: float):
        self.temperature = temperature

    def __call__(self, input_ids, scores):
        return torch.log_softmax(scores / self.temperature, dim=-1)


def hf_beams(model, width, max_new, temperature):
    ids = torch.tensor([PROMPT])
    processors = LogitsProcessorList([ScaledLogprobs(temperature)] if temperature != 1 else [])
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        num_beams=width,
        num_return_sequences=width,
        do_sample=False,
        max_new_tokens=max_new,
        logits_processor=processors,
        pad_token_id=2,
        eos_token_id=2,
    )
    return [row[len(PROMPT) :].tolist() for row in out]


def strip_padding(beams):
    return [[t for t in b if t != 2] for b in beams]


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    path = tiny_model_dir("llama")
    return path, AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def beams(llm, **params):
    params = SamplingParams(use_beam_search=True, best_of=3, n=3, max_tokens=16, **params)
    out = llm.generate({"prompt_token_ids": PROMPT}, params, use_tqdm=False)[0]
    return [o.token_ids for o in out.outputs]


def test_temperature_scales_beam_scores_as_hf_with_scaled_logprobs(tiny, make_llm):
    path, hf = tiny
    llm = make_llm(model=str(path), max_model_len=256, num_kv_blocks=128)
    unscaled = beams(llm, temperature=0)
    assert beams(llm) == unscaled  # the default temperature, 1.0, leaves scores as they are
    assert strip_padding(hf_beams(hf, 3, 16, 1.0)) == strip_padding(unscaled)
    differs = False
    for temperature in (0.05, 20.0):
        got = beams(llm, temperature=temperature)
        assert strip_padding(got) == strip_padding(hf_beams(hf, 3, 16, temperature))
        differs |= got != unscaled
    assert differs  # the temperature changed the search, so this test can tell


def test_top_k_is_ignored_with_one_warning(tiny, make_llm, caplog, monkeypatch):
    monkeypatch.setattr(sampling_params_module, "_top_k_warned", False)
    path, _ = tiny
    llm = make_llm(model=str(path), max_model_len=256, num_kv_blocks=128)
    with caplog.at_level(logging.WARNING, logger=sampling_params_module.__name__):
        seed_style = beams(llm, temperature=1.0, top_k=1)  # the seed's beam example
        beams(llm, top_k=50)
    warnings = [r for r in caplog.records if "top_k" in r.getMessage()]
    assert len(warnings) == 1 and "ignored with use_beam_search=True" in warnings[0].getMessage()
    assert seed_style == beams(llm, temperature=0)


def test_llm_beam_search_api_matches_the_engines_beam_search(tiny, make_llm):
    path, _ = tiny
    llm = make_llm(model=str(path), max_model_len=256, num_kv_blocks=128)
    params = BeamSearchParams(beam_width=3, max_tokens=16, temperature=0.3)
    outs = llm.beam_search([{"prompt_token_ids": PROMPT}, {"prompt_token_ids": PROMPT[:4]}], params)
    assert len(outs) == 2 and all(len(o.sequences) == 3 for o in outs)
    first = outs[0].sequences
    assert [s.tokens[: len(PROMPT)] for s in first] == [PROMPT] * 3
    assert [s.tokens[len(PROMPT) :] for s in first] == beams(llm, temperature=0.3)
    scores = [s.cum_logprob for s in first]
    assert scores == sorted(scores, reverse=True)  # best first
    assert all(s.finish_reason in ("stop", "length") for s in first)
    assert isinstance(first[0].text, str)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"beam_width": 1, "max_tokens": 4}, "beam_width"),
        ({"beam_width": True, "max_tokens": 4}, "beam_width"),
        ({"beam_width": 2, "max_tokens": 0}, "max_tokens"),
        ({"beam_width": 2, "max_tokens": 4, "temperature": -1}, "temperature"),
        ({"beam_width": 2, "max_tokens": 4, "length_penalty": 1e9}, "length_penalty"),
    ],
)
def test_bad_beam_search_params_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        BeamSearchParams(**kwargs)


def test_beam_search_needs_beam_search_params(tiny, make_llm):
    llm = make_llm(model=str(tiny[0]), max_model_len=256, num_kv_blocks=128)
    with pytest.raises(TypeError, match="BeamSearchParams, got SamplingParams"):
        llm.beam_search([{"prompt_token_ids": PROMPT}], SamplingParams())
