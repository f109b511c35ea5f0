"""RoPE tables, computed as HF computes them, for every rope_scaling type the engine serves.

LongRoPE (Phi-3 long-context models) switches in HF from its short factors to its long ones
once a sequence passes ``original_max_position_embeddings``, re-rotating only the new tokens.
The engine chooses once, from the longest sequence it serves: short factors when
``max_model_len`` fits the original length (HF's output for every sequence), long factors
otherwise (HF's output for prompts past the original length), never a mix within a cache.
"""

from __future__ import annotations

import torch
from transformers import PretrainedConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS


def rope_type(config: PretrainedConfig) -> str:
    scaling = getattr(config, "rope_scaling", None) or {}
    return scaling.get("rope_type", scaling.get("type", "default"))


def rope_table(config: PretrainedConfig, max_positions: int, device) -> torch.Tensor:
    """[max_positions, 2 * rotary_dim]: cos then sin, as HF's rotary embedding computes them
    (the rotary dim is head_dim times ``partial_rotary_factor``, as HF takes it)."""
    kind = rope_type(config)
    if kind not in ROPE_INIT_FUNCTIONS or kind == "dynamic":
        raise ValueError(f"rope_scaling type {kind!r} in the model config is not supported")
    init = ROPE_INIT_FUNCTIONS[kind]
    if kind == "longrope":
        inv_freq, attention_scaling = init(config, torch.device("cpu"), seq_len=max_positions)
    else:
        inv_freq, attention_scaling = init(config, torch.device("cpu"))
    positions = torch.arange(max_positions, dtype=torch.float32)
    freqs = positions[:, None] * inv_freq.float()[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    table = torch.cat((emb.cos() * attention_scaling, emb.sin() * attention_scaling), dim=-1)
    return table.to(device)
