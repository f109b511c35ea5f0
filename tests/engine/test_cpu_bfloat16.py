"""bfloat16 on the CPU (native bf16 kernels: LoRA, decode attention, norm, RoPE) stays close to
HF / PEFT float32 in vLLM's sense, in one mixed batch of base and adapter requests: at every
step of greedy decoding the engine's token is in the reference's top 5 and the reference's top
token is in the engine's top 5 (the reference teacher-forced on the engine's tokens)."""

from __future__ import annotations

import pytest
import torch
from peft import PeftModel
from test_multi_lora import ADAPTERS, make_adapters, requests_for
from transformers import AutoModelForCausalLM

from loragate import kernels
from loragate.engine import SamplingParams
from loragate.engine.loading.cpu_features import NATIVE_BF16_FLAGS, OVERRIDE_ENV, cpu_flags

QUESTIONS = [
    "Name a large animal that lives in the sea.",
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain in two sentences why the sky is blue.",
]


def reference_logits(model, name, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        if name is None:
            with model.disable_adapter():
                return model(input_ids=torch.tensor([ids])).logits[0].float()
        model.set_adapter(name)
        return model(input_ids=torch.tensor([ids])).logits[0].float()


# Where the CPU has native bf16 the engine packs bf16 weights for oneDNN (kernels/linear.py);
# the suite's conftest says "not native" so that dtype="auto" means float32, so the packed
# run says "native" itself.
@pytest.mark.parametrize(
    "native",
    [
        False,
        pytest.param(
            True,
            marks=pytest.mark.skipif(
                not set(NATIVE_BF16_FLAGS) & cpu_flags(), reason="the CPU has no native bf16"
            ),
        ),
    ],
    ids=["plain", "packed"],
)
def test_default_model_bfloat16_mixed_batch_is_top5_close_to_float32(
    default_hf_dir, tmp_path, make_llm, monkeypatch, native
):
    monkeypatch.setenv(OVERRIDE_ENV, "1" if native else "0")
    n = 24
    specs = {k: ADAPTERS[k] for k in ("r8-all", "r16-mlp-rslora", "r64-ko")}
    paths = make_adapters(default_hf_dir, tmp_path, specs, init_scale=0.5)
    loras = requests_for(paths)
    llm = make_llm(
        dtype="bfloat16",
        gguf_dequantize=True,  # bf16 weights: a GGUF's blocks would keep their own types
        max_model_len=512,
        kv_cache_memory_gb=0.25,
        enable_lora=True,
        max_loras=4,
        max_lora_rank=64,
    )
    base = AutoModelForCausalLM.from_pretrained(default_hf_dir, dtype=torch.float32).eval()
    names = list(paths)
    model = PeftModel.from_pretrained(base, paths[names[0]], adapter_name=names[0])
    for name in names[1:]:
        model.load_adapter(paths[name], adapter_name=name)
    model.eval()
    packed = [
        isinstance(layer["qkv"], kernels.PackedWeight) for layer in llm.llm_engine.model.layers
    ]
    assert all(packed) if native else not any(packed)
    prompts = [llm.apply_chat_template([{"role": "user", "content": q}]) for q in QUESTIONS]
    rows = [(name, prompts[i % len(prompts)]) for i, name in enumerate([None, *names, None])]
    outs = llm.generate(
        [{"prompt_token_ids": p} for _, p in rows],
        SamplingParams(temperature=0, max_tokens=n, min_tokens=n, logprobs=5),
        lora_request=[loras[name] if name else None for name, _ in rows],
        use_tqdm=False,
    )
    differs = False
    for (name, prompt), out in zip(rows, outs, strict=True):
        tokens, logprobs = out.outputs[0].token_ids, out.outputs[0].logprobs
        assert len(tokens) == len(logprobs) == n
        logits = reference_logits(model, name, prompt + tokens)[len(prompt) - 1 : -1]
        top5 = logits.topk(5, dim=-1).indices.tolist()
        for step, (token, engine_top) in enumerate(zip(tokens, logprobs, strict=True)):
            assert token in top5[step], f"{name} step {step}: engine token not in top 5"
            engine_top5 = sorted(engine_top, key=engine_top.get, reverse=True)[:5]
            assert top5[step][0] in engine_top5, f"{name} step {step}: top not in engine's 5"
        if name is not None:
            base_logits = reference_logits(model, None, prompt + tokens)[len(prompt) - 1 : -1]
            differs |= not torch.equal(base_logits.argmax(-1), logits.argmax(-1))
    assert differs, "the adapters must change the reference's output, or this test cannot fail"
