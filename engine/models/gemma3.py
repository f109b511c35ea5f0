"""Gemma 3 text models (``gemma3_text``, and the text part of a ``gemma3`` checkpoint):
embeddings scaled by sqrt(hidden) in the model's dtype, RMSNorm weights stored minus one,
norms before and after both attention and the MLP, a GELU-tanh gated MLP, q/k norm, the
attention scaled by ``query_pre_attn_scalar``, and sliding-window local layers (the config's
``layer_types``) whose RoPE has its own base (``rope_local_base_freq``, no scaling) beside the
global layers' (with the config's scaling)."""

from __future__ import annotations

import copy
from dataclasses import replace

import torch
from transformers import PretrainedConfig

from loragate.engine.models.architecture import Architecture
from loragate.engine.models.llama import LlamaFamily, Take, TakeOptional
from loragate.engine.models.rope import rope_table

GLOBAL_ROPE, LOCAL_ROPE = 0, 1
# Where a multimodal gemma3 checkpoint keeps its language model's tensors.
NESTED_PREFIXES = (
    ("model.language_model.", "model."),
    ("language_model.model.", "model."),
    ("language_model.lm_head.", "lm_head."),
)


class Gemma3Family(LlamaFamily):
    name = "gemma3"
    model_types = ("gemma3_text", "gemma3")

    def check(self, config: PretrainedConfig) -> None:
        act = getattr(config, "hidden_activation", None) or config.hidden_act
        if act not in ("gelu_pytorch_tanh", "gelu_tanh"):
            raise ValueError(f"hidden_activation {act!r} is not supported (Gemma 3 uses gelu)")
        if getattr(config, "attn_logit_softcapping", None) is not None:
            raise ValueError("attn_logit_softcapping is not supported")
        if getattr(config, "use_bidirectional_attention", False):
            raise ValueError("use_bidirectional_attention=True is not supported")

    def architecture(self, config: PretrainedConfig) -> Architecture:
        arch = super().architecture(config)
        local = tuple(
            LOCAL_ROPE if kind == "sliding_attention" else GLOBAL_ROPE
            for kind in config.layer_types
        )
        return replace(
            arch,
            family=self.name,
            activation="gelu_tanh",
            qk_norm=True,
            sandwich_norms=True,
            attention_scale=config.query_pre_attn_scalar**-0.5,
            embed_scale=config.hidden_size**0.5,
            final_logit_softcap=getattr(config, "final_logit_softcapping", None),
            layer_rope=local,
        )

    def rope_tables(self, config: PretrainedConfig, max_positions: int, device) -> list:
        local = copy.deepcopy(config)
        local.rope_theta = config.rope_local_base_freq
        local.rope_scaling = {"rope_type": "default"}
        return [
            rope_table(config, max_positions, device),
            rope_table(local, max_positions, device),
        ]

    def norm_weight(self, weight: torch.Tensor) -> torch.Tensor:
        """HF computes norm(x) * (1 + w) in float32: the sum is taken in float32 here too."""
        return 1.0 + weight.float()

    def layer_weights(self, take: Take, optional: TakeOptional, prefix: str) -> dict:
        weights = super().layer_weights(take, optional, prefix)
        weights["attn_out_norm"] = weights.pop("mlp_norm")  # Gemma's post_attention_layernorm
        weights["mlp_norm"] = self.norm_weight(take(prefix + "pre_feedforward_layernorm.weight"))
        weights["mlp_out_norm"] = self.norm_weight(
            take(prefix + "post_feedforward_layernorm.weight")
        )
        weights["q_norm"] = self.norm_weight(take(prefix + "self_attn.q_norm.weight"))
        weights["k_norm"] = self.norm_weight(take(prefix + "self_attn.k_norm.weight"))
        return weights

    def checkpoint_names(self, names: set[str]) -> dict[str, str]:
        renamed = {}
        for name in names:
            for nested, plain in NESTED_PREFIXES:
                if name.startswith(nested):
                    renamed[name] = plain + name[len(nested) :]
        return renamed
