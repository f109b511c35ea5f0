"""Every adapter kind over HTTP (issue 45, must-show 2): the adapters with their PEFT
references, a concurrent mixed batch through TGI's /generate, and the check that each answer
is PEFT's. Shared by the one-server upload test and the two-replica test."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
from adapter_kinds_testlib import make_every_kind
from tenancy_testlib import Api
from tiny_llama import hf_greedy, peft_model_with
from transformers import AutoModelForCausalLM, AutoTokenizer

N = 12
PROMPTS = ["Hello world", "The sea is calm tonight", "Hello, the world of the sea"]
# A whole copy of embed_tokens and lm_head on the tiny model is 2 x 49152 x 64 floats.
MAX_ADAPTER_BYTES = 64 << 20


def every_kind_with_references(model_dir: Path, root: Path) -> tuple[dict, dict]:
    """(name -> adapter directory, PEFT reference per name and None for the base); the
    trainable tokens are words of PROMPTS."""
    tokens = AutoTokenizer.from_pretrained(model_dir).encode(" world sea", add_special_tokens=False)
    paths = make_every_kind(model_dir, root, tokens)
    # PEFT holds an embedding LoRA and a saved embedding in one model only apart: one each.
    references = {name: peft_model_with(model_dir, {name: p}) for name, p in paths.items()}
    references[None] = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    return paths, {k: v.eval() for k, v in references.items()}


def generate(api: Api, adapter: str | None, text: str) -> tuple[list[int], list[int]]:
    """(prompt ids, greedy ids) of TGI's /generate, with the adapter or the base."""
    parameters = {"max_new_tokens": N, "details": True, "decoder_input_details": True}
    if adapter is not None:
        parameters["adapter_id"] = adapter
    got = api.post("/generate", {"inputs": text, "parameters": parameters})
    assert got.status_code == 200, got.text
    details = got.json()["details"]
    return [t["id"] for t in details["prefill"]], [t["id"] for t in details["tokens"]]


def assert_mixed_batch_matches_peft(api: Api, references: dict, rounds: int = 1) -> None:
    """Every (adapter or base, prompt) pair, `rounds` times over, sent at once: each answer
    PEFT's for that adapter alone, and every adapter changes some answer."""
    jobs = [(name, text) for name in references for text in PROMPTS] * rounds
    with ThreadPoolExecutor(len(jobs)) as pool:
        results = list(pool.map(lambda job: generate(api, *job), jobs))
    changed = set()  # adapters whose answer differs from the base's somewhere
    for (prompt, tokens), (name, text) in zip(results, jobs, strict=True):
        expected = hf_greedy(references[name], prompt, N)
        assert tokens == expected, f"{name} on {text!r}"
        if name is not None and expected != hf_greedy(references[None], prompt, N):
            changed.add(name)
    assert changed == set(references) - {None}, f"only {sorted(changed)} change the answers"
