"""Phi-3 and Phi-4-mini (``phi3``): q, k and v stored as one ``qkv_proj`` and gate and up as
one ``gate_up_proj``, partial rotary embeddings (``partial_rotary_factor``: RoPE on the first
part of each head only), and LongRoPE for the long-context variants (rope.py says how it is
chosen). Adapters name the fused modules, so each is one LoRA module over all its columns,
exactly as PEFT applies it."""

from __future__ import annotations

from dataclasses import replace

from transformers import PretrainedConfig

from loragate.engine.models.architecture import Architecture
from loragate.engine.models.llama import (
    LlamaFamily,
    Take,
    TakeOptional,
    head_dim_of,
    kv_heads_of,
)


class Phi3Family(LlamaFamily):
    name = "phi3"
    model_types = ("phi3",)

    def architecture(self, config: PretrainedConfig) -> Architecture:
        arch = super().architecture(config)
        factor = getattr(config, "partial_rotary_factor", 1.0) or 1.0
        return replace(
            arch,
            family=self.name,
            rotary_dim=int(arch.head_dim * factor),
            fused_checkpoint=True,
        )

    def lora_modules(self, config: PretrainedConfig) -> dict[str, tuple[int, int]]:
        hidden, inter = config.hidden_size, config.intermediate_size
        head_dim = head_dim_of(config)
        q_out = config.num_attention_heads * head_dim
        return {
            "qkv_proj": (hidden, q_out + 2 * kv_heads_of(config) * head_dim),
            "o_proj": (q_out, hidden),
            "gate_up_proj": (hidden, 2 * inter),
            "down_proj": (inter, hidden),
        }

    def lora_fused_groups(self) -> dict[str, tuple[str, ...]]:
        return {}  # the checkpoint's own modules are already the fused projections

    def layer_weights(self, take: Take, optional: TakeOptional, prefix: str) -> dict:
        return {
            "input_norm": take(prefix + "input_layernorm.weight"),
            "mlp_norm": take(prefix + "post_attention_layernorm.weight"),
            "qkv": take(prefix + "self_attn.qkv_proj.weight"),
            "qkv_bias": optional(prefix + "self_attn.qkv_proj.bias"),
            "o": take(prefix + "self_attn.o_proj.weight"),
            "gate_up": take(prefix + "mlp.gate_up_proj.weight"),
            "down": take(prefix + "mlp.down_proj.weight"),
        }
