"""Qwen3 (dense): the Llama family with a per-head RMSNorm on q and k before RoPE, and
head_dim taken from the config rather than hidden / heads. Qwen3 MoE is another model type
(``qwen3_moe``) and is refused at start."""

from __future__ import annotations

from dataclasses import replace

from transformers import PretrainedConfig

from loragate.engine.models.architecture import Architecture
from loragate.engine.models.llama import LlamaFamily, Take, TakeOptional


class Qwen3Family(LlamaFamily):
    name = "qwen3"
    model_types = ("qwen3",)

    def architecture(self, config: PretrainedConfig) -> Architecture:
        return replace(super().architecture(config), family=self.name, qk_norm=True)

    def layer_weights(self, take: Take, optional: TakeOptional, prefix: str) -> dict:
        weights = super().layer_weights(take, optional, prefix)
        weights["q_norm"] = self.norm_weight(take(prefix + "self_attn.q_norm.weight"))
        weights["k_norm"] = self.norm_weight(take(prefix + "self_attn.k_norm.weight"))
        return weights
