"""The base model as Hugging Face loads it, for the tools that write adapters for it."""

from __future__ import annotations

from pathlib import Path

from loragate.engine.model_loader import resolve_model


def resolve_base_model(model: str | None):
    """The model source (`.name`, `.hf_dir`) for an HF directory, a .gguf file, or None (the
    default model). ValueError or FileNotFoundError for a model that is not there."""
    return resolve_model(model)


def load_hf_model(hf_dir: Path):
    """The base model in float32, as PEFT trains and writes adapters for it."""
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
