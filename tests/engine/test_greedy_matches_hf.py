"""Greedy output equals HF transformers `generate`, token for token, in float32."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from loragate.engine import SamplingParams

CHATS = [
    "Hi!",
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain in two sentences why the sky is blue.",
    "List five fruits that are red, and say one thing about each of them.",
    "Write a short story about a robot who learns to paint. Give the robot a name, "
    "describe its workshop, its first failed painting, and the moment it finally succeeds.",
    "Translate 'good morning, how are you today?' into French, Spanish and German.",
    "You are a helpful assistant for a bakery. A customer asks which of your breads are "
    "gluten free, whether you deliver on Sundays, and how long a sourdough loaf keeps. "
    "Answer all three questions politely.",
    "What is 17 times 23? Show your working step by step.",
]
NEW_TOKENS = 48


def hf_greedy(model, prompt_ids: list[int], n: int) -> list[int]:
    ids = torch.tensor([prompt_ids])
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=n,
        min_new_tokens=n,
        do_sample=False,
        pad_token_id=2,
    )
    return out[0, len(prompt_ids) :].tolist()


@pytest.fixture(scope="module")
def chat_prompts(default_llm):
    return [default_llm.apply_chat_template([{"role": "user", "content": c}]) for c in CHATS]


def test_batched_greedy_matches_hf_and_runs_alone(default_llm, hf_default_model, chat_prompts):
    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, min_tokens=NEW_TOKENS)
    inputs = [{"prompt_token_ids": p} for p in chat_prompts]
    batched = default_llm.generate(inputs, params, use_tqdm=False)
    assert len({len(p) for p in chat_prompts}) == len(chat_prompts)  # all lengths differ
    for prompt, out in zip(chat_prompts, batched, strict=True):
        expected = hf_greedy(hf_default_model, prompt, NEW_TOKENS)
        assert out.outputs[0].token_ids == expected
        assert out.outputs[0].finish_reason == "length"
    for prompt, out in zip(chat_prompts[:3], batched[:3], strict=True):
        alone = default_llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)
        assert alone[0].outputs[0].token_ids == out.outputs[0].token_ids


def test_chat_api_uses_template_and_stops_at_eos(default_llm):
    out = default_llm.chat(
        [{"role": "user", "content": "What is the capital of France?"}],
        SamplingParams(temperature=0, max_tokens=40),
        use_tqdm=False,
    )[0]
    assert "Paris" in out.outputs[0].text
    assert out.outputs[0].finish_reason == "stop"
    assert out.outputs[0].token_ids[-1] == 2  # <|im_end|>


@pytest.mark.parametrize("kind", ["llama", "llama3-rope", "qwen2"])
def test_tiny_family_variants_match_hf(tiny_model_dir, make_llm, kind):
    """Tied/untied embeddings, GQA 2:1 and 4:1, llama3 rope scaling, qkv bias (Qwen2)."""
    path = tiny_model_dir(kind)
    llm = make_llm(model=str(path), max_model_len=256, kv_cache_memory_gb=0.05)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    prompts = [[1, 2, 3, 4, 5, 6, 7], list(range(100, 160)), [42] * 20]
    outs = llm.generate(
        [{"prompt_token_ids": p} for p in prompts],
        SamplingParams(temperature=0, max_tokens=40, min_tokens=40),
        use_tqdm=False,
    )
    for prompt, out in zip(prompts, outs, strict=True):
        assert out.outputs[0].token_ids == hf_greedy(hf, prompt, 40)
