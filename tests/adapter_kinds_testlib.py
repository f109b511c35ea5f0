"""One adapter of every kind loragate serves (issue 45), written as PEFT writes them for a
model directory: plain LoRA, DoRA, a lora_B bias, LoRA on embed_tokens and lm_head, whole
copies of both (modules_to_save) and trainable tokens. Whole copies and trainable rows start
as the base's in PEFT: they are moved here as training would, so each kind changes answers.
Imported by bare name (tests/ is on sys.path) by the HTTP, replica, hot-swap and bf16 tests."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from loragate.tools import make_random_adapter

LAYERS = ["q_proj", "v_proj", "down_proj"]
SAVED_SUFFIXES = ("embed_tokens.weight", "lm_head.weight", "trainable_tokens_delta")


def kind_specs(tokens: list[int]) -> dict[str, dict]:
    """name -> make_random_adapter keywords; `tokens`: the trainable tokens' ids."""
    return {
        "plain": dict(rank=8, alpha=16, targets=LAYERS),
        "dora": dict(rank=4, alpha=8, targets=LAYERS, use_dora=True),
        "biased": dict(rank=6, alpha=6, targets=LAYERS, lora_bias=True),
        "vocab-lora": dict(rank=4, targets=[*LAYERS, "embed_tokens", "lm_head"]),
        "saved": dict(rank=4, targets=LAYERS, modules_to_save=["embed_tokens", "lm_head"]),
        "tokens": dict(rank=4, targets=LAYERS, trainable_token_indices=list(tokens)),
    }


# What a loaded adapter of each name says it is.
KIND_OF = {
    "plain": "lora",
    "dora": "dora",
    "biased": "lora+bias",
    "vocab-lora": "lora+vocab-lora",
    "saved": "lora+saved-modules",
    "tokens": "lora+trainable-tokens",
}


def perturb_saved(path: Path, seed: int, size: float) -> None:
    """Move an adapter's whole copies and trainable rows away from the base's."""
    weights = load_file(path / "adapter_model.safetensors")
    generator = torch.Generator().manual_seed(seed)
    for key, value in weights.items():
        if key.endswith(SAVED_SUFFIXES):
            weights[key] = value + size * torch.randn(value.shape, generator=generator)
    save_file(weights, path / "adapter_model.safetensors")


def make_kind(base, out: Path, spec: dict, seed: int, init_scale: float = 0.4) -> Path:
    """One adapter of `spec` (a kind_specs value) for the loaded `base` model."""
    spec = dict(spec)
    path = make_random_adapter(
        base,
        out,
        rank=spec.pop("rank"),
        targets=spec.pop("targets"),
        seed=seed,
        init_scale=init_scale,
        **spec,
    )
    perturb_saved(path, seed + 100, init_scale)
    return path


def make_every_kind(
    model_dir, root: Path, tokens: list[int], init_scale: float = 0.4, seed: int = 80
) -> dict[str, Path]:
    """One adapter of each kind under `root`, name -> directory."""
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    return {
        name: make_kind(base, Path(root) / name, spec, seed + i, init_scale)
        for i, (name, spec) in enumerate(kind_specs(tokens).items())
    }
