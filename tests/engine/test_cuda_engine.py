"""The engine on CUDA (skipped cleanly without a GPU): float32 greedy equals HF / PEFT run on
the same GPU, token for token, in mixed batches of base and adapter rows; bfloat16 stays
top-5-close to HF float32 at every step (vLLM's logprob-closeness)."""

from __future__ import annotations

import pytest
import torch
from peft import PeftModel
from test_multi_lora import ADAPTERS, requests_for
from tiny_llama import make_adapters
from transformers import AutoModelForCausalLM

from loragate.engine import SamplingParams

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

QUESTIONS = [
    "Name a large animal that lives in the sea.",
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain in two sentences why the sky is blue.",
]


def cuda_peft_model(model_dir, paths) -> PeftModel:
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).cuda().eval()
    names = list(paths)
    model = PeftModel.from_pretrained(base, paths[names[0]], adapter_name=names[0])
    for name in names[1:]:
        model.load_adapter(paths[name], adapter_name=name)
    return model.eval()


def cuda_greedy(model, name: str | None, prompt: list[int], n: int) -> list[int]:
    ids = torch.tensor([prompt], device="cuda")
    kwargs = dict(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=n,
        min_new_tokens=n,
        do_sample=False,
        pad_token_id=2,
    )
    with torch.inference_mode():
        if name is None:
            with model.disable_adapter():
                out = model.generate(**kwargs)
        else:
            model.set_adapter(name)
            out = model.generate(**kwargs)
    return out[0, len(prompt) :].tolist()


def check_mixed_batch(llm, peft_model, loras, prompts, n: int) -> None:
    names = [None, *loras, None, *reversed(list(loras))]
    rows = [(name, prompts[i % len(prompts)]) for i, name in enumerate(names)]
    outs = llm.generate(
        [{"prompt_token_ids": p} for _, p in rows],
        SamplingParams(temperature=0, max_tokens=n, min_tokens=n),
        lora_request=[loras[name] if name else None for name, _ in rows],
        use_tqdm=False,
    )
    for (name, prompt), out in zip(rows, outs, strict=True):
        assert out.outputs[0].token_ids == cuda_greedy(peft_model, name, prompt, n), name
    # The adapters really change the output (otherwise this test could not fail).
    base = cuda_greedy(peft_model, None, rows[0][1], n)
    assert any(cuda_greedy(peft_model, name, rows[0][1], n) != base for name in loras)


def test_tiny_mixed_batch_float32_matches_peft_on_cuda(tiny_model_dir, tmp_path, make_llm):
    model_dir = tiny_model_dir("llama")
    paths = make_adapters(model_dir, tmp_path, ADAPTERS)
    llm = make_llm(
        model=str(model_dir),
        device="cuda",
        dtype="float32",
        max_model_len=256,
        num_kv_blocks=256,
        enable_lora=True,
        max_loras=8,
        max_lora_rank=64,
    )
    prompts = [[1] + list(range(300 + 11 * i, 310 + 37 * i)) for i in range(6)]
    check_mixed_batch(llm, cuda_peft_model(model_dir, paths), requests_for(paths), prompts, 24)


def test_default_model_mixed_batch_float32_matches_peft_on_cuda(default_hf_dir, tmp_path, make_llm):
    specs = {k: ADAPTERS[k] for k in ("r4-attn", "r8-all", "r16-mlp-rslora", "r64-ko")}
    paths = make_adapters(default_hf_dir, tmp_path, specs, init_scale=0.5)
    llm = make_llm(
        device="cuda",
        dtype="float32",
        max_model_len=512,
        kv_cache_memory_gb=0.25,
        enable_lora=True,
        max_loras=4,
        max_lora_rank=64,
    )
    prompts = [llm.apply_chat_template([{"role": "user", "content": q}]) for q in QUESTIONS]
    check_mixed_batch(llm, cuda_peft_model(default_hf_dir, paths), requests_for(paths), prompts, 24)


def test_default_model_bfloat16_is_top5_close_to_hf_float32(default_hf_dir, make_llm):
    """At every step of the bf16 engine's greedy output, its token is in HF float32's top 5
    and HF's top token is in the engine's top 5 (HF teacher-forced on the engine's tokens)."""
    n = 32
    llm = make_llm(device="cuda", dtype="bfloat16", max_model_len=512, kv_cache_memory_gb=0.25)
    hf = AutoModelForCausalLM.from_pretrained(default_hf_dir, dtype=torch.float32).cuda().eval()
    prompts = [llm.apply_chat_template([{"role": "user", "content": q}]) for q in QUESTIONS]
    outs = llm.generate(
        [{"prompt_token_ids": p} for p in prompts],
        SamplingParams(temperature=0, max_tokens=n, min_tokens=n, logprobs=5),
        use_tqdm=False,
    )
    assert_top5_close(hf, prompts, outs, n)


def assert_top5_close(hf, prompts, outs, n: int) -> None:
    """vLLM's logprob-closeness: at every step the engine's token is in HF float32's top 5
    and HF's top token in the engine's (HF teacher-forced on the engine's tokens)."""
    for prompt, out in zip(prompts, outs, strict=True):
        tokens, logprobs = out.outputs[0].token_ids, out.outputs[0].logprobs
        assert len(tokens) == len(logprobs) == n
        ids = torch.tensor([prompt + tokens], device="cuda")
        with torch.inference_mode():
            logits = hf(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
        hf_top5 = logits.topk(5, dim=-1).indices.tolist()
        for step, (token, engine_top) in enumerate(zip(tokens, logprobs, strict=True)):
            assert token in hf_top5[step], f"step {step}: engine token {token} not in HF top 5"
            engine_top5 = sorted(engine_top, key=engine_top.get, reverse=True)[:5]
            assert hf_top5[step][0] in engine_top5, f"step {step}: HF top not in engine top 5"
