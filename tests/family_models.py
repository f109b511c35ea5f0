"""Tiny random models of the families the engine runs besides Llama (Qwen3, Gemma 3, Phi-3),
a Llama 3.x with its rope scaling and a Mistral with a sliding window, each made from its own
transformers config class, with the default model's tokenizer, and their PEFT adapters.

Weights are drawn at unit scale per input feature and every norm weight away from its
identity (as tiny_llama.py does for Llama), so q/k norms, the extra Gemma norms, local and
global RoPE bases and each layer's window all change the output. Imported by bare name.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
from transformers import (
    AutoModelForCausalLM,
    Gemma3TextConfig,
    LlamaConfig,
    MistralConfig,
    Phi3Config,
    Qwen3Config,
)

from loragate.tools.base_model import TOKENIZER_FILES

BASE = dict(
    hidden_size=64,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=49152,
    tie_word_embeddings=False,
)
# Gemma's local layers (and every layer of the Mistral) attend this many positions: the
# tests' prompts are longer.
GEMMA_WINDOW = 8
# Phi-3's LongRoPE: sequences up to this length use the short factors, as in HF.
PHI3_ORIGINAL_LEN = 96


def family_config(family: str):
    if family == "qwen3":
        return Qwen3Config(
            **BASE, num_hidden_layers=3, head_dim=32, rms_norm_eps=1e-6, max_position_embeddings=512
        )
    if family == "gemma3":
        return Gemma3TextConfig(
            **BASE,
            num_hidden_layers=3,
            head_dim=256,
            query_pre_attn_scalar=24,
            sliding_window=GEMMA_WINDOW,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"],
            rope_theta=1_000_000.0,
            rope_local_base_freq=10_000.0,
            rope_scaling={"rope_type": "linear", "factor": 2.0},
            final_logit_softcapping=30.0,
            max_position_embeddings=512,
        )
    if family == "phi3":
        rotary_half = (64 // 4) // 2 // 2  # head_dim 16, half of it rotary: 4 frequencies
        return Phi3Config(
            **BASE,
            num_hidden_layers=3,
            partial_rotary_factor=0.5,
            original_max_position_embeddings=PHI3_ORIGINAL_LEN,
            max_position_embeddings=4 * PHI3_ORIGINAL_LEN,
            rope_scaling={
                "type": "longrope",
                "short_factor": [1.0 + 0.25 * i for i in range(rotary_half)],
                "long_factor": [2.0 + i for i in range(rotary_half)],
            },
            pad_token_id=2,
        )
    if family == "llama3":
        return LlamaConfig(
            **{**BASE, "num_key_value_heads": 1},
            num_hidden_layers=2,
            rope_theta=500000.0,
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 32,
            },
            max_position_embeddings=512,
        )
    if family == "qwen3-tied":  # tied embeddings: the output matrix is the embedding
        return Qwen3Config(
            **{**BASE, "tie_word_embeddings": True},
            num_hidden_layers=2,
            head_dim=32,
            max_position_embeddings=512,
        )
    if family == "mistral":
        return MistralConfig(
            **BASE, num_hidden_layers=2, sliding_window=GEMMA_WINDOW, max_position_embeddings=512
        )
    raise ValueError(family)


# The modules each family's adapters name (Phi-3's are its fused projections).
LORA_TARGETS = {
    "qwen3": ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
    "gemma3": ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
    "llama3": ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
    "phi3": ("qkv_proj", "o_proj", "gate_up_proj", "down_proj"),
    "mistral": ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
}
FAMILIES = tuple(LORA_TARGETS)


def build_family_model(family: str, seed: int = 0):
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(family_config(family), dtype=torch.float32)
    with torch.no_grad():
        model.get_input_embeddings().weight.normal_(0, 1)
        model.lm_head.weight.normal_(0, 1)
        for name, param in model.model.named_parameters():
            if name.endswith("norm.weight"):
                param.add_(torch.randn_like(param) * 0.2)
        for module in model.model.layers.modules():
            if isinstance(module, torch.nn.Linear):
                module.weight.normal_(0, module.in_features**-0.5)
    return model.eval()


def save_family_model(family: str, out: Path, tokenizer_dir: Path) -> Path:
    build_family_model(family).save_pretrained(out, safe_serialization=True)
    for name in TOKENIZER_FILES:
        if (Path(tokenizer_dir) / name).exists():
            shutil.copy(Path(tokenizer_dir) / name, Path(out) / name)
    return Path(out)
