"""Beam search through the engine equals HF transformers' beam search, token for token."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from loragate.engine import SamplingParams


def hf_beams(model, prompt, width, n, max_new, length_penalty, early_stopping):
    ids = torch.tensor([prompt])
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        num_beams=width,
        num_return_sequences=n,
        do_sample=False,
        max_new_tokens=max_new,
        length_penalty=length_penalty,
        early_stopping=early_stopping,
        pad_token_id=2,
        eos_token_id=2,
    )
    return [row[len(prompt) :].tolist() for row in out]


def assert_same_beams(got: list[list[int]], expected: list[list[int]]):
    assert len(got) == len(expected)
    for tokens, ref in zip(got, expected, strict=True):
        assert tokens == ref[: len(tokens)]
        assert all(t == 2 for t in ref[len(tokens) :])  # HF pads finished beams


@pytest.mark.parametrize(
    "width, n, length_penalty, early_stopping",
    [(2, 1, 1.0, False), (4, 2, 1.0, False), (4, 4, 0.5, True), (3, 2, 2.0, "never")],
)
def test_tiny_model_beams_match_hf(
    tiny_model_dir, make_llm, width, n, length_penalty, early_stopping
):
    path = tiny_model_dir("llama")
    llm = make_llm(model=str(path), max_model_len=256, num_kv_blocks=128)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    prompt = [1, 50, 60, 70, 80, 90, 100]
    params = SamplingParams(
        use_beam_search=True,
        best_of=width,
        n=n,
        temperature=0,
        max_tokens=24,
        length_penalty=length_penalty,
        early_stopping=early_stopping,
    )
    out = llm.generate({"prompt_token_ids": prompt}, params, use_tqdm=False)[0]
    expected = hf_beams(hf, prompt, width, n, 24, length_penalty, early_stopping)
    assert_same_beams([o.token_ids for o in out.outputs], expected)


def test_default_model_beam_search_matches_hf(default_llm, hf_default_model):
    prompt = default_llm.apply_chat_template([{"role": "user", "content": "What is 2+2?"}])
    params = SamplingParams(use_beam_search=True, best_of=4, n=2, temperature=0, max_tokens=40)
    out = default_llm.generate({"prompt_token_ids": prompt}, params, use_tqdm=False)[0]
    expected = hf_beams(hf_default_model, prompt, 4, 2, 40, 1.0, False)
    got = [o.token_ids for o in out.outputs]
    assert_same_beams(got, expected)
    assert got[0][-1] == 2 and out.outputs[0].finish_reason == "stop"  # ended by <|im_end|>
    assert "4" in out.outputs[0].text


def test_beam_forks_share_blocks_and_free_them(tiny_model_dir, make_llm):
    llm = make_llm(
        model=str(tiny_model_dir("llama")),
        max_model_len=256,
        num_kv_blocks=128,
        enable_prefix_caching=False,
    )
    engine = llm.engine
    params = SamplingParams(
        use_beam_search=True, best_of=4, temperature=0, max_tokens=30, ignore_eos=True
    )
    engine.add_request("beam", {"prompt_token_ids": [1] + list(range(300, 347))}, params)
    savings = []
    while engine.has_unfinished_requests():
        engine.step()
        live = [s for s in engine.scheduler.running if s.request.request_id == "beam"]
        if len(live) == 4:
            held = sum(len(s.block_table) for s in live)
            savings.append(1 - engine.get_memory_stats()["allocated_blocks"] / held)
        engine.check_integrity()
    # Each beam ends holding 5 blocks (78 tokens), the 3 prompt blocks shared by all four:
    # at worst 3 + 4 * 2 = 11 distinct blocks for 20 held.
    assert savings and min(savings) >= 1 - 11 / 20 - 1e-9
    assert engine.get_memory_stats()["allocated_blocks"] == 0
