"""`loragate serve --lora-modules name=DIR` with each adapter kind of issue 45 (DoRA, whole
copies of embed_tokens and lm_head, LoRA on embed_tokens and lm_head): the server registers
them at start and each answers as the offline engine does for the same files (greedy,
float32), and differently from the base."""

from __future__ import annotations

import httpx
import torch
from adapter_kinds_testlib import kind_specs, make_kind
from servers_testlib import ServeProcess
from transformers import AutoModelForCausalLM

from loragate.adapters import LoRARequest
from loragate.engine import LLM, SamplingParams

KINDS = ("dora", "saved", "vocab-lora")
PROMPTS = ("Once upon a time", "The capital of")
MAX_TOKENS = 8


def test_serve_lora_modules_of_every_new_kind_answers_like_offline(tiny_dir, tmp_path):
    base = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32)
    specs = kind_specs([5, 17])
    paths = {
        name: make_kind(base, tmp_path / name, specs[name], seed=70 + i)
        for i, name in enumerate(KINDS)
    }
    options = dict(max_model_len=512, num_kv_blocks=128, dtype="float32", max_lora_rank=8)
    llm = LLM(model=str(tiny_dir), enable_lora=True, **options)
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    offline = {}
    for i, name in enumerate((None, *KINDS)):
        lora = LoRARequest(name, i, str(paths[name])) if name else None
        outs = llm.generate(list(PROMPTS), params, lora_request=lora, use_tqdm=False)
        offline[name] = [o.outputs[0].text for o in outs]
    del llm
    flags = [
        arg for key, value in options.items() for arg in (f"--{key.replace('_', '-')}", str(value))
    ]
    server = ServeProcess(
        str(tiny_dir),
        "--served-model-name",
        "tiny",
        "--lora-modules",
        *(f"{name}={path}" for name, path in paths.items()),
        "--max-adapter-bytes",
        str(64 * 2**20),
        *flags,
    )
    try:
        listed = httpx.get(f"{server.url}/v1/models").json()["data"]
        assert set(KINDS) <= {m["id"] for m in listed}
        for name in (None, *KINDS):
            answers = []
            for prompt in PROMPTS:
                got = httpx.post(
                    f"{server.url}/v1/completions",
                    json={
                        "model": name or "tiny",
                        "prompt": prompt,
                        "max_tokens": MAX_TOKENS,
                        "temperature": 0,
                        "ignore_eos": True,
                    },
                    timeout=120,
                )
                assert got.status_code == 200, got.text
                answers.append(got.json()["choices"][0]["text"])
            assert answers == offline[name], name
    finally:
        server.stop()
    for name in KINDS:
        assert offline[name] != offline[None], f"{name} answers as the base"
