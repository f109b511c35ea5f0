"""Tiny random Llama models shared by the adapter tests.

Imported by bare name: pytest puts tests/adapters on sys.path.
"""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

TINY_NAME = "tiny-llama"


def tiny_config(**overrides) -> LlamaConfig:
    fields = dict(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        vocab_size=128,
        max_position_embeddings=128,
    )
    fields.update(overrides)
    return LlamaConfig(**fields)


def tiny_model(seed: int = 0, **overrides) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    return LlamaForCausalLM(tiny_config(**overrides)).eval()
