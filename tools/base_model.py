"""The base model as Hugging Face loads it, for the tools that write adapters for it."""

from __future__ import annotations

from pathlib import Path

from loragate.engine.loading.model_loader import resolve_model

# The files of a model directory that a model made from a config alone takes over to speak
# and chat as that model does (the tests' tiny models, the GPU check's stand-in).
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "generation_config.json",
)


def resolve_base_model(model: str | None):
    """The model source (`.name`, `.hf_dir`) for an HF directory, a .gguf file, or None (the
    default model). ValueError or FileNotFoundError for a model that is not there."""
    return resolve_model(model)


def load_hf_model(hf_dir: Path):
    """The base model in float32, as PEFT trains and writes adapters for it."""
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
