"""prompt_logprobs (vLLM's field; LoRAX's decoder_input_details): every prompt token after
the first gets its logprob under the model, equal to HF's, also when the prompt is
prefilled in chunks, was cached by an earlier request, or is shared by n > 1 samples."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from loragate.engine import SamplingParams


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    model_dir = tiny_model_dir("llama")
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    return model_dir, hf


def hf_prompt_logprobs(hf, prompt: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        logits = hf(input_ids=torch.tensor([prompt])).logits[0].float()
    return torch.log_softmax(logits, dim=-1)  # row p: the distribution of token p + 1


def check(out, hf, prompt: list[int], top_n: int) -> None:
    expected = hf_prompt_logprobs(hf, prompt)
    got = out.prompt_logprobs
    assert got is not None and len(got) == len(prompt) and got[0] is None
    for p in range(len(prompt) - 1):
        entry, token = got[p + 1], prompt[p + 1]
        assert abs(entry[token] - expected[p, token].item()) < 1e-4, p
        top = expected[p].topk(top_n).indices.tolist()
        assert set(top) <= set(entry) and len(entry) <= top_n + 1, p


@pytest.mark.parametrize("budget", [None, 16])
def test_prompt_logprobs_match_hf(tiny, make_llm, budget):
    model_dir, hf = tiny
    options = {"max_num_batched_tokens": budget, "max_num_seqs": 4} if budget else {}
    llm = make_llm(model=str(model_dir), max_model_len=256, num_kv_blocks=128, **options)
    prompts = [[1] + list(range(400 + 7 * i, 440 + 9 * i)) for i in range(3)]
    outs = llm.generate(
        [{"prompt_token_ids": p} for p in prompts],
        [SamplingParams(temperature=0, max_tokens=4, prompt_logprobs=k) for k in (0, 3, 5)],
        use_tqdm=False,
    )
    for prompt, out, k in zip(prompts, outs, (0, 3, 5), strict=True):
        check(out, hf, prompt, k)
    plain = llm.generate([{"prompt_token_ids": prompts[0]}], SamplingParams(max_tokens=2))
    assert plain[0].prompt_logprobs is None


def test_cached_prefix_and_samples_still_get_every_prompt_logprob(tiny, make_llm):
    model_dir, hf = tiny
    llm = make_llm(model=str(model_dir), max_model_len=256, num_kv_blocks=128)
    prompt = [1] + list(range(500, 560))
    llm.generate([{"prompt_token_ids": prompt}], SamplingParams(max_tokens=2), use_tqdm=False)
    out = llm.generate(
        [{"prompt_token_ids": prompt}],
        SamplingParams(n=2, temperature=1.0, seed=1, max_tokens=3, prompt_logprobs=2),
        use_tqdm=False,
    )[0]
    assert len(out.outputs) == 2
    check(out, hf, prompt, 2)


def test_prompt_logprobs_must_be_a_count():
    with pytest.raises(ValueError, match="prompt_logprobs"):
        SamplingParams(prompt_logprobs=-1)
