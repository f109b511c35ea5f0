"""What one decoder family is made of, resolved from a model's config: the data the shared
paged decoder (decoder.py) runs on, and what the start log says about the model."""

from __future__ import annotations

from dataclasses import dataclass

ACTIVATIONS = ("silu", "gelu_tanh")


@dataclass(frozen=True)
class Architecture:
    """Shapes and per-family choices of one model. ``layer_windows[i]`` is layer i's sliding
    window (0: the whole context); ``layer_rope[i]`` picks its RoPE table from the family's
    ``rope_tables`` (Gemma 3's local layers use their own base)."""

    family: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    eps: float
    attention_scale: float
    rotary_dim: int
    layer_windows: tuple[int, ...]
    layer_rope: tuple[int, ...]
    activation: str = "silu"
    qk_norm: bool = False
    sandwich_norms: bool = False  # norms after attention and after the MLP too (Gemma)
    embed_scale: float | None = None
    final_logit_softcap: float | None = None
    fused_checkpoint: bool = False  # qkv_proj and gate_up_proj stored fused (Phi-3)

    def __post_init__(self):
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation {self.activation!r} is not one of {ACTIVATIONS}")
        if len(self.layer_windows) != self.num_layers or len(self.layer_rope) != self.num_layers:
            raise ValueError("layer_windows and layer_rope need one entry per layer")
        if self.rotary_dim < 2 or self.rotary_dim > self.head_dim or self.rotary_dim % 2:
            raise ValueError(
                f"rotary_dim {self.rotary_dim} must be even and within head_dim {self.head_dim}"
            )

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def describe(self) -> str:
        """One line for the start log: the family and what it uses."""
        uses = [f"head_dim {self.head_dim}", f"GQA {self.num_heads}/{self.num_kv_heads}"]
        windowed = [w for w in self.layer_windows if w]
        if windowed:
            uses.append(
                f"sliding window {max(windowed)} on {len(windowed)} of {self.num_layers} layers"
            )
        if self.qk_norm:
            uses.append("q/k norm")
        if self.sandwich_norms:
            uses.append("norms before and after attention and MLP")
        if self.rotary_dim < self.head_dim:
            uses.append(f"partial rotary ({self.rotary_dim} of {self.head_dim} dims)")
        if self.fused_checkpoint:
            uses.append("fused qkv_proj and gate_up_proj")
        if self.activation != "silu":
            uses.append(self.activation)
        if self.embed_scale is not None:
            uses.append(f"embeddings scaled by {self.embed_scale:.4g}")
        if self.final_logit_softcap is not None:
            uses.append(f"logits soft-capped at {self.final_logit_softcap}")
        return f"{self.family}: {self.num_layers} layers, " + ", ".join(uses)
