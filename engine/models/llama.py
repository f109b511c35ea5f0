"""The Llama family (Llama 2/3 with their rope scaling, Mistral, Qwen2, SmolLM), and the
defaults every other family (qwen3.py, gemma3.py, phi3.py) changes only where it differs.

A family turns a config into an Architecture, names its checkpoint's tensors and the modules
its adapters target; the shared paged decoder (decoder.py) runs all of them.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from transformers import PretrainedConfig

from loragate.adapters.spec import LoRAModelSpec
from loragate.engine.models.architecture import Architecture
from loragate.engine.models.rope import rope_table
from loragate.kernels import stack_rows

# Projections computed here as one matmul on one input, in column order. Each module's adapter
# adds to its own columns of the fused output (adapters/slots.py says why not one call each).
LORA_FUSED_GROUPS = {
    "qkv_proj": ("q_proj", "k_proj", "v_proj"),
    "gate_up_proj": ("gate_proj", "up_proj"),
}

ATTENTION_MODULES = frozenset({"q_proj", "k_proj", "v_proj", "o_proj", "qkv_proj"})

# A checkpoint tensor by name (raising a clear error when it is missing), or None if optional.
Take = Callable[[str], torch.Tensor]
TakeOptional = Callable[[str], torch.Tensor | None]


def head_dim_of(config: PretrainedConfig) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def kv_heads_of(config: PretrainedConfig) -> int:
    return getattr(config, "num_key_value_heads", None) or config.num_attention_heads


def lora_module_shapes(config: PretrainedConfig) -> dict[str, tuple[int, int]]:
    """``(d_in, d_out)`` of each LoRA-targetable linear layer of a Llama-family config."""
    hidden, inter = config.hidden_size, config.intermediate_size
    head_dim = head_dim_of(config)
    q_out, kv_out = config.num_attention_heads * head_dim, kv_heads_of(config) * head_dim
    return {
        "q_proj": (hidden, q_out),
        "k_proj": (hidden, kv_out),
        "v_proj": (hidden, kv_out),
        "o_proj": (q_out, hidden),
        "gate_proj": (hidden, inter),
        "up_proj": (hidden, inter),
        "down_proj": (inter, hidden),
    }


def lora_spec(config: PretrainedConfig, model_name: str) -> LoRAModelSpec:
    """What a Llama-family model offers LoRA, as the data the adapter layer validates against."""
    return LlamaFamily().lora_spec(config, model_name)


def layer_windows(config: PretrainedConfig) -> tuple[int, ...]:
    """Each layer's sliding window, as HF masks it: the config's ``layer_types`` where it has
    them (Qwen2/3, Gemma 3), else ``sliding_window`` on every layer (Mistral, Phi-3)."""
    window = getattr(config, "sliding_window", None) or 0
    types = getattr(config, "layer_types", None)
    if types is not None:
        return tuple(window if kind == "sliding_attention" else 0 for kind in types)
    return (window,) * config.num_hidden_layers


class LlamaFamily:
    """RMSNorm, RoPE over the whole head, GQA, SwiGLU, separate q/k/v and gate/up tensors."""

    name = "llama"
    model_types: tuple[str, ...] = ("llama", "mistral", "qwen2")

    def check(self, config: PretrainedConfig) -> None:
        """Refuse what this family's decoder does not compute, naming the setting."""
        act = getattr(config, "hidden_act", "silu")
        if act not in ("silu", "swish"):
            raise ValueError(f"hidden_act {act!r} is not supported ({self.name} uses silu)")
        if getattr(config, "mlp_bias", False):
            raise ValueError("mlp_bias=True is not supported")

    def architecture(self, config: PretrainedConfig) -> Architecture:
        self.check(config)
        head_dim = head_dim_of(config)
        return Architecture(
            family=self.name,
            num_layers=config.num_hidden_layers,
            hidden_size=config.hidden_size,
            num_heads=config.num_attention_heads,
            num_kv_heads=kv_heads_of(config),
            head_dim=head_dim,
            intermediate_size=config.intermediate_size,
            vocab_size=config.vocab_size,
            eps=config.rms_norm_eps,
            attention_scale=head_dim**-0.5,
            rotary_dim=head_dim,
            layer_windows=layer_windows(config),
            layer_rope=(0,) * config.num_hidden_layers,
        )

    def rope_tables(self, config: PretrainedConfig, max_positions: int, device) -> list:
        """The RoPE tables ``Architecture.layer_rope`` indexes: one for every layer here."""
        return [rope_table(config, max_positions, device)]

    def lora_modules(self, config: PretrainedConfig) -> dict[str, tuple[int, int]]:
        return lora_module_shapes(config)

    def lora_fused_groups(self) -> dict[str, tuple[str, ...]]:
        return dict(LORA_FUSED_GROUPS)

    def lora_spec(self, config: PretrainedConfig, model_name: str) -> LoRAModelSpec:
        return LoRAModelSpec(
            model_name=model_name,
            num_layers=config.num_hidden_layers,
            modules=self.lora_modules(config),
            fused=self.lora_fused_groups(),
            vocab_size=config.vocab_size,
            hidden_size=config.hidden_size,
            tied_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
        )

    def norm_weight(self, weight: torch.Tensor) -> torch.Tensor:
        """An RMSNorm weight as the decoder multiplies by it (Gemma stores it minus one)."""
        return weight

    def layer_weights(self, take: Take, optional: TakeOptional, prefix: str) -> dict:
        """One layer's tensors under the decoder's names, fused where the decoder fuses (rows
        stacked: float tensors concatenated, GGUF blocks kept, kernels.stack_rows)."""
        biases = [optional(prefix + f"self_attn.{n}_proj.bias") for n in "qkv"]
        return {
            "input_norm": self.norm_weight(take(prefix + "input_layernorm.weight")),
            "mlp_norm": self.norm_weight(take(prefix + "post_attention_layernorm.weight")),
            "qkv": stack_rows([take(prefix + f"self_attn.{n}_proj.weight") for n in "qkv"]),
            "qkv_bias": torch.cat(biases) if all(b is not None for b in biases) else None,
            "o": take(prefix + "self_attn.o_proj.weight"),
            "gate_up": stack_rows(
                [take(prefix + "mlp.gate_proj.weight"), take(prefix + "mlp.up_proj.weight")]
            ),
            "down": take(prefix + "mlp.down_proj.weight"),
        }

    def module_weight_name(self, layer: int, module: str) -> str:
        """The checkpoint name of a LoRA-targetable module's base weight."""
        block = "self_attn" if module in ATTENTION_MODULES else "mlp"
        return f"model.layers.{layer}.{block}.{module}.weight"

    def checkpoint_names(self, names: set[str]) -> dict[str, str]:
        """Checkpoint names to the decoder's ``model.*`` / ``lm_head.*`` names, where a
        checkpoint nests them (Gemma 3's multimodal files); empty when they match."""
        return {}
