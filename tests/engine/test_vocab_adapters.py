"""Adapters on the vocabulary side beside plain LoRA and base rows in one batch, with
staggered arrivals, chunked prefill and preemption, each row's float32 greedy tokens equal
to PEFT's for that adapter alone: LoRA on embed_tokens and on lm_head, whole copies of both
(modules_to_save), and trainable tokens, on the tiny model (untied) and on a tied one."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file
from staggered_testlib import TIGHT_LORA_ENGINE, drive_under_pressure
from tiny_llama import hf_greedy, peft_model_with
from transformers import AutoModelForCausalLM

from loragate.adapters import LoRARequest
from loragate.tools import make_random_adapter

N = 12
LAYERS = ["q_proj", "v_proj", "down_proj"]
# Tokens the prompts below use, so trainable tokens change what the model reads.
TOKENS = [905, 942, 1016]
ADAPTERS = {
    "plain": dict(rank=8, targets=LAYERS),
    "vocab-lora": dict(rank=4, targets=[*LAYERS, "embed_tokens", "lm_head"]),
    "saved": dict(rank=4, targets=LAYERS, modules_to_save=["embed_tokens", "lm_head"]),
    "tokens": dict(rank=4, targets=LAYERS, trainable_token_indices=TOKENS),
}


def _perturb_saved(path, seed: int, size: float) -> None:
    """Whole copies and trainable rows start as the base's: move them as training would."""
    weights = load_file(path / "adapter_model.safetensors")
    generator = torch.Generator().manual_seed(seed)
    for key, value in weights.items():
        if key.endswith(("embed_tokens.weight", "lm_head.weight", "trainable_tokens_delta")):
            weights[key] = value + size * torch.randn(value.shape, generator=generator)
    save_file(weights, path / "adapter_model.safetensors")


def make_vocab_adapters(model_dir, root, init_scale: float):
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    paths = {}
    for i, (name, spec) in enumerate(ADAPTERS.items()):
        spec = dict(spec)
        paths[name] = make_random_adapter(
            base,
            root / name,
            rank=spec.pop("rank"),
            targets=spec.pop("targets"),
            seed=60 + i,
            init_scale=init_scale,
            **spec,
        )
        _perturb_saved(paths[name], 70 + i, init_scale)
    return paths


@pytest.fixture(scope="module", params=["untied", "tied"])
def setup(request, tiny_model_dir, tmp_path_factory, tokenizer_dir):
    if request.param == "untied":
        model_dir = tiny_model_dir("llama")
    else:
        from family_models import save_family_model

        model_dir = save_family_model("qwen3-tied", tmp_path_factory.mktemp("tied"), tokenizer_dir)
    # A tied model's logits follow its input embeddings closely: larger changes move them.
    scale = 0.4 if request.param == "untied" else 2.0
    paths = make_vocab_adapters(model_dir, tmp_path_factory.mktemp("vocab-adapters"), scale)
    # PEFT holds an embedding LoRA and a saved embedding in one model only apart: one each.
    references = {name: peft_model_with(model_dir, {name: p}) for name, p in paths.items()}
    references[None] = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    return str(model_dir), paths, references


def test_vocab_side_adapters_in_a_mixed_batch_match_peft(setup, make_llm):
    model_dir, paths, references = setup
    loras = {name: LoRARequest(name, i + 1, str(p)) for i, (name, p) in enumerate(paths.items())}
    names = ["vocab-lora", None, "saved", "tokens", "plain", "saved", "vocab-lora", "tokens"]
    arrivals = []
    for i, name in enumerate(names):
        ids = [1] + [
            (TOKENS[j % 3] if j % 4 == 0 else 500 + 31 * i + 7 * j) for j in range(8 + 5 * i)
        ]
        arrivals.append((i, f"v{i}", ids, loras.get(name)))
    engine = make_llm(model=model_dir, **TIGHT_LORA_ENGINE).engine
    outputs, _ = drive_under_pressure(engine, arrivals, N)
    changed = set()  # adapters whose answer differs from the base's somewhere
    for (_, rid, ids, _), name in zip(arrivals, names, strict=True):
        expected = hf_greedy(references[name].eval(), ids, N)
        assert outputs[rid] == expected, f"{rid} ({name})"
        if name is not None and expected != hf_greedy(references[None].eval(), ids, N):
            changed.add(name)
    assert changed == set(ADAPTERS), f"only {sorted(changed)} change the answers"


def test_vocab_side_adapters_say_their_kind_and_real_size(setup, make_llm):
    model_dir, paths, _ = setup
    llm = make_llm(model=model_dir, dtype="float32", enable_lora=True, max_lora_rank=8)
    loaded = {
        name: llm.llm_engine.add_adapter(LoRARequest(name, i + 1, str(p)))
        for i, (name, p) in enumerate(paths.items())
    }
    assert loaded["plain"].kind == "lora"
    assert loaded["vocab-lora"].kind == "lora+vocab-lora"
    assert loaded["saved"].kind == "lora+saved-modules"
    assert loaded["tokens"].kind == "lora+trainable-tokens"
    vocab, hidden = 49152, 64
    assert loaded["saved"].num_params > 2 * vocab * hidden
    assert loaded["saved"].size_bytes > 2 * vocab * hidden * 4
    assert loaded["tokens"].vocab.token_rows.shape == (len(TOKENS), hidden)
