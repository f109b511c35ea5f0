"""The Llama family (Llama 2/3, Mistral, Qwen2, SmolLM) over a paged KV cache.

One flat batch of tokens per forward pass. q/k/v and gate/up run as fused matmuls, and so do
their LoRA deltas: one batched shrink and one expand per fused projection add every module's
delta into its columns of the fused output.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import PretrainedConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from loragate import kernels
from loragate.adapters.spec import LoRAModelSpec
from loragate.engine.cpu_features import bf16_support
from loragate.engine.forward_batch import ForwardBatch, LoRABatch
from loragate.engine.kv_cache import KVCache

# Projections computed here as one matmul on one input, in column order. Each module's adapter
# adds to its own columns of the fused output (adapters/slots.py says why not one call each).
LORA_FUSED_GROUPS = {
    "qkv_proj": ("q_proj", "k_proj", "v_proj"),
    "gate_up_proj": ("gate_proj", "up_proj"),
}


def lora_module_shapes(config: PretrainedConfig) -> dict[str, tuple[int, int]]:
    """``(d_in, d_out)`` of each LoRA-targetable linear layer of a Llama-family config."""
    hidden, inter = config.hidden_size, config.intermediate_size
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    q_out, kv_out = heads * head_dim, kv_heads * head_dim
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
    """What this model offers LoRA, as the data the adapter layer validates against."""
    return LoRAModelSpec(
        model_name=model_name,
        num_layers=config.num_hidden_layers,
        modules=lora_module_shapes(config),
        fused=dict(LORA_FUSED_GROUPS),
    )


class LlamaForCausalLM:
    """Weights as plain tensors; the forward pass is a function of the batch and the cache."""

    def __init__(self, config: PretrainedConfig, device: torch.device, dtype: torch.dtype):
        self.config = config
        self.device = device
        self.dtype = dtype
        self.num_layers = config.num_hidden_layers
        self.hidden_size = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = getattr(config, "num_key_value_heads", None) or self.num_heads
        self.head_dim = getattr(config, "head_dim", None) or self.hidden_size // self.num_heads
        self.intermediate_size = config.intermediate_size
        self.vocab_size = config.vocab_size
        self.eps = config.rms_norm_eps
        self.scale = self.head_dim**-0.5
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        _check_supported(config)
        self.layers: list[dict[str, torch.Tensor]] = []
        self.embed_tokens: torch.Tensor | None = None
        self.norm: torch.Tensor | None = None
        self.lm_head: torch.Tensor | None = None
        self.cos_sin: torch.Tensor | None = None

    # ---- what the adapter layer needs ---------------------------------------------------
    def lora_spec(self, model_name: str) -> LoRAModelSpec:
        """This model's LoRA-targetable modules, their shapes and its fused groups."""
        return lora_spec(self.config, model_name)

    # ---- loading ------------------------------------------------------------------------
    def load_weights(self, weights: dict[str, torch.Tensor], max_positions: int) -> None:
        def take(name: str) -> torch.Tensor:
            if name not in weights:
                raise ValueError(f"weights are missing tensor {name!r}")
            return weights[name].to(device=self.device, dtype=self.dtype)

        def take_optional(name: str) -> torch.Tensor | None:
            return take(name) if name in weights else None

        self.embed_tokens = take("model.embed_tokens.weight")
        self.norm = take("model.norm.weight")
        if getattr(self.config, "tie_word_embeddings", False) or "lm_head.weight" not in weights:
            self.lm_head = self.embed_tokens
        else:
            self.lm_head = take("lm_head.weight")
        _expect_shape("model.embed_tokens.weight", self.embed_tokens, (self.vocab_size, None))
        self.layers = []
        native_bf16 = self.dtype == torch.bfloat16 and bf16_support().native
        for i in range(self.num_layers):
            p = f"model.layers.{i}."
            qkv = torch.cat([take(p + f"self_attn.{n}_proj.weight") for n in "qkv"])
            _expect_shape(p + "qkv", qkv, (self.q_size + 2 * self.kv_size, self.hidden_size))
            biases = [take_optional(p + f"self_attn.{n}_proj.bias") for n in "qkv"]
            layer = {
                "input_norm": take(p + "input_layernorm.weight"),
                "post_norm": take(p + "post_attention_layernorm.weight"),
                "qkv": qkv,
                "qkv_bias": torch.cat(biases) if all(b is not None for b in biases) else None,
                "o": take(p + "self_attn.o_proj.weight"),
                "gate_up": torch.cat(
                    [take(p + "mlp.gate_proj.weight"), take(p + "mlp.up_proj.weight")]
                ),
                "down": take(p + "mlp.down_proj.weight"),
            }
            _expect_shape(p + "gate_up", layer["gate_up"], (2 * self.intermediate_size, None))
            for name in ("qkv", "o", "gate_up", "down"):
                layer[name] = kernels.pack_weight(layer[name], native_bf16)
            self.layers.append(layer)
        # the embedding keeps its own copy
        self.lm_head = kernels.pack_weight(self.lm_head, native_bf16)
        self.cos_sin = _rope_table(self.config, max_positions, self.device).to(self.dtype)

    # ---- forward ------------------------------------------------------------------------
    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, kv: KVCache) -> torch.Tensor:
        """Hidden states (after the final norm) of the rows in batch.sample_indices.

        Each layer's closing residual add is fused with the next layer's input norm (and the
        attention's with the post-attention norm): kernels.add_rms_norm, one pass on the CPU.
        """
        residual = F.embedding(batch.input_ids, self.embed_tokens)
        x = kernels.rms_norm(residual, self.layers[0]["input_norm"], self.eps)
        for i, layer in enumerate(self.layers):
            down, residual = self._layer(i, layer, x, residual, batch, kv)
            if i + 1 < self.num_layers:
                x, residual = kernels.add_rms_norm(
                    down, residual, self.layers[i + 1]["input_norm"], self.eps
                )
        rows = batch.sample_indices
        return kernels.rms_norm(residual[rows] + down[rows], self.norm, self.eps)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return kernels.linear(hidden, self.lm_head).float()

    def _layer(self, i, layer, x, residual, batch: ForwardBatch, kv: KVCache):
        """x = the layer's normed input, residual = the stream it was normed from; returns
        the MLP output and the residual stream after attention (their sum is the output)."""
        t = x.shape[0]
        qkv = kernels.linear(x, layer["qkv"], layer["qkv_bias"])
        if batch.lora is not None:
            _add_lora(batch.lora, i, "qkv_proj", x, qkv)
        rotated = self.num_heads + self.num_kv_heads  # q and k heads, side by side in qkv
        kernels.apply_rope_(
            qkv[:, : rotated * self.head_dim].view(t, rotated, self.head_dim),
            self.cos_sin,
            batch.positions,
        )
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(t, self.num_heads, self.head_dim)
        k = k.view(t, self.num_kv_heads, self.head_dim)
        v = v.view(t, self.num_kv_heads, self.head_dim)
        k_cache, v_cache = kv.layer(i)
        kernels.write_kv(k, v, k_cache, v_cache, batch.slot_mapping)
        attn = self._attention(q, k_cache, v_cache, batch).reshape(t, self.q_size)
        o = kernels.linear(attn, layer["o"])
        if batch.lora is not None:
            _add_lora(batch.lora, i, "o_proj", attn, o)
        x, residual = kernels.add_rms_norm(o, residual, layer["post_norm"], self.eps)
        gate_up = kernels.linear(x, layer["gate_up"])
        if batch.lora is not None:
            _add_lora(batch.lora, i, "gate_up_proj", x, gate_up)
        gate, up = gate_up.chunk(2, dim=-1)
        act = F.silu(gate) * up
        down = kernels.linear(act, layer["down"])
        if batch.lora is not None:
            _add_lora(batch.lora, i, "down_proj", act, down)
        return down, residual

    def _attention(self, q, k_cache, v_cache, batch: ForwardBatch) -> torch.Tensor:
        parts = []
        n_pre = batch.prefill.num_tokens if batch.prefill is not None else 0
        if batch.prefill is not None:
            p = batch.prefill
            parts.append(
                kernels.paged_prefill_attention(
                    q[:n_pre],
                    k_cache,
                    v_cache,
                    p.block_tables,
                    p.seq_lens,
                    p.query_start_loc,
                    self.scale,
                )
            )
        if batch.decode is not None:
            d = batch.decode
            parts.append(
                kernels.paged_decode_attention(
                    q[n_pre:], k_cache, v_cache, d.block_tables, d.seq_lens, self.scale
                )
            )
        return parts[0] if len(parts) == 1 else torch.cat(parts)


def _add_lora(lora: LoRABatch, layer: int, group: str, x: torch.Tensor, out: torch.Tensor):
    """Each module of a group (a fused projection or a single one) adds its adapters' output
    to its own columns of the fused output, reading only its own weights: one call for the
    whole group."""
    kernels.lora_apply_modules(
        x,
        lora.weights.module_group(layer, group, lora.rank),
        lora.slot_ids,
        lora.weights.scales,
        out,
        index=lora.index,
    )


def _rope_table(config: PretrainedConfig, max_positions: int, device) -> torch.Tensor:
    """[max_positions, 2 * head_dim]: cos then sin, computed as HF computes them."""
    scaling = getattr(config, "rope_scaling", None) or {}
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type not in ROPE_INIT_FUNCTIONS or rope_type == "dynamic":
        raise ValueError(f"rope_scaling type {rope_type!r} in the model config is not supported")
    inv_freq, attention_scaling = ROPE_INIT_FUNCTIONS[rope_type](config, torch.device("cpu"))
    positions = torch.arange(max_positions, dtype=torch.float32)
    freqs = positions[:, None] * inv_freq.float()[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    table = torch.cat((emb.cos() * attention_scaling, emb.sin() * attention_scaling), dim=-1)
    return table.to(device)


def _check_supported(config: PretrainedConfig) -> None:
    act = getattr(config, "hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise ValueError(f"hidden_act {act!r} is not supported (Llama-family models use silu)")
    if getattr(config, "mlp_bias", False):
        raise ValueError("mlp_bias=True is not supported")
    window = getattr(config, "sliding_window", None)
    if window and getattr(config, "use_sliding_window", True) and config.model_type == "mistral":
        if window < getattr(config, "max_position_embeddings", window):
            raise ValueError(f"sliding_window={window} attention is not supported")


def _expect_shape(name: str, tensor: torch.Tensor, shape: tuple) -> None:
    ok = len(tensor.shape) == len(shape) and all(
        want is None or have == want for have, want in zip(tensor.shape, shape, strict=True)
    )
    if not ok:
        raise ValueError(f"tensor {name} has shape {tuple(tensor.shape)}, expected {shape}")
