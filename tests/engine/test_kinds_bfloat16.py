"""bfloat16 on the CPU for every adapter kind (issue 45, must-show 1's bf16 half): DoRA, a
lora_B bias, LoRA on embed_tokens and lm_head, whole copies of both (modules_to_save) and
trainable tokens, beside plain LoRA and base rows in one batch, stay close to PEFT float32 in
vLLM's sense: at every greedy step the engine's token is in the reference's top 5 and the
reference's top token in the engine's top 5 (the reference teacher-forced on the engine's
tokens). On the tiny model (untied) and on a tied one, where lm_head is the embedding."""

from __future__ import annotations

import pytest
import torch
from adapter_kinds_testlib import make_every_kind
from tiny_llama import peft_model_with
from transformers import AutoModelForCausalLM

from loragate.adapters import LoRARequest
from loragate.engine import SamplingParams

N = 16
TOKENS = [905, 942, 1016]  # the trainable tokens, which the prompts use


def prompt(i: int) -> list[int]:
    return [1] + [
        (TOKENS[j % 3] if j % 4 == 0 else 500 + 31 * i + 7 * j) for j in range(10 + 4 * i)
    ]


def reference_logits(model, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return model(input_ids=torch.tensor([ids])).logits[0].float()


@pytest.fixture(scope="module", params=["untied", "tied"])
def setup(request, tiny_model_dir, tmp_path_factory, tokenizer_dir):
    if request.param == "untied":
        model_dir = tiny_model_dir("llama")
    else:
        from family_models import save_family_model

        model_dir = save_family_model("qwen3-tied", tmp_path_factory.mktemp("tied"), tokenizer_dir)
    # A tied model's logits follow its input embeddings closely: larger changes move them.
    scale = 0.4 if request.param == "untied" else 2.0
    paths = make_every_kind(model_dir, tmp_path_factory.mktemp("bf16-kinds"), TOKENS, scale)
    # PEFT holds an embedding LoRA and a saved embedding in one model only apart: one each.
    references = {name: peft_model_with(model_dir, {name: p}).eval() for name, p in paths.items()}
    references[None] = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    return str(model_dir), paths, references


def test_every_kind_in_bfloat16_is_top5_close_to_peft_float32(setup, make_llm):
    model_dir, paths, references = setup
    loras = {name: LoRARequest(name, i + 1, str(p)) for i, (name, p) in enumerate(paths.items())}
    names = [None, *paths, "dora", "saved"]
    llm = make_llm(
        model=model_dir,
        dtype="bfloat16",
        max_model_len=128,
        enable_lora=True,
        max_loras=4,
        max_lora_rank=8,
    )
    assert llm.llm_engine.model.dtype == torch.bfloat16
    rows = [prompt(i) for i in range(len(names))]
    outs = llm.generate(
        [{"prompt_token_ids": p} for p in rows],
        SamplingParams(temperature=0, max_tokens=N, min_tokens=N, logprobs=5),
        lora_request=[loras.get(name) for name in names],
        use_tqdm=False,
    )
    changed = set()  # adapters whose reference's argmax differs from the base's somewhere
    for name, ids, out in zip(names, rows, outs, strict=True):
        tokens, logprobs = out.outputs[0].token_ids, out.outputs[0].logprobs
        assert len(tokens) == len(logprobs) == N
        logits = reference_logits(references[name], ids + tokens)[len(ids) - 1 : -1]
        top5 = logits.topk(5, dim=-1).indices.tolist()
        for step, (token, engine_top) in enumerate(zip(tokens, logprobs, strict=True)):
            assert token in top5[step], f"{name} step {step}: engine token not in top 5"
            engine_top5 = sorted(engine_top, key=engine_top.get, reverse=True)[:5]
            assert top5[step][0] in engine_top5, f"{name} step {step}: top not in engine's 5"
        base = reference_logits(references[None], ids + tokens)[len(ids) - 1 : -1]
        if name is not None and not torch.equal(base.argmax(-1), logits.argmax(-1)):
            changed.add(name)
    assert changed == set(paths), f"only {sorted(changed)} change the reference's answers"
