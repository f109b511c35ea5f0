"""What the base model offers LoRA: which linear layers, their shapes, how many layers."""

from __future__ import annotations

from dataclasses import dataclass, field

SUPPORTED_MODULES = (
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
)

# Projections a Llama-family model computes as one matmul on one input. Their adapters share
# one shrink and one expand per layer, which at decode sizes costs little more than one module.
LLAMA_FUSED_GROUPS = {
    "qkv_proj": ("q_proj", "k_proj", "v_proj"),
    "gate_up_proj": ("gate_proj", "up_proj"),
}


@dataclass(frozen=True)
class LoRAModelSpec:
    """The engine's model as the adapter layer sees it; built once by the engine.

    ``modules`` maps each LoRA-targetable module name to ``(d_in, d_out)``. ``fused`` names
    groups of modules the model runs as one matmul on one input (same d_in); their output
    columns follow the group's module order. Every other module is a group of its own.
    """

    model_name: str
    num_layers: int
    modules: dict[str, tuple[int, int]] = field(hash=False)
    fused: dict[str, tuple[str, ...]] = field(default_factory=dict, hash=False)

    def __post_init__(self):
        if not isinstance(self.model_name, str):
            raise ValueError(f"model_name must be a string, got {self.model_name!r}")
        if isinstance(self.num_layers, bool) or not isinstance(self.num_layers, int):
            raise ValueError(f"num_layers must be an int, got {self.num_layers!r}")
        if self.num_layers < 1:
            raise ValueError(f"num_layers must be >= 1, got {self.num_layers}")
        if not self.modules:
            raise ValueError("modules must name at least one LoRA-targetable module")
        checked = {}
        for name, dims in self.modules.items():
            if name not in SUPPORTED_MODULES:
                raise ValueError(
                    f"module {name!r} is not LoRA-targetable; "
                    f"supported: {', '.join(SUPPORTED_MODULES)}"
                )
            if (
                not isinstance(dims, tuple | list)
                or len(dims) != 2
                or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in dims)
            ):
                raise ValueError(f"module {name!r} needs (d_in, d_out) positive ints, got {dims!r}")
            checked[name] = (int(dims[0]), int(dims[1]))
        object.__setattr__(self, "modules", checked)
        object.__setattr__(self, "fused", self._checked_fused())

    @property
    def groups(self) -> dict[str, tuple[str, ...]]:
        """Every module in exactly one group: the fused ones, then each other module alone."""
        groups = dict(self.fused)
        in_fused = {m for members in self.fused.values() for m in members}
        groups.update((m, (m,)) for m in self.modules if m not in in_fused)
        return groups

    def _checked_fused(self) -> dict[str, tuple[str, ...]]:
        if not isinstance(self.fused, dict):
            raise ValueError(f"fused must map group names to module tuples, got {self.fused!r}")
        seen: set[str] = set()
        checked = {}
        for name, members in self.fused.items():
            if name in self.modules:
                raise ValueError(f"fused group name {name!r} is also a module name")
            members = tuple(members)
            unknown = [m for m in members if m not in self.modules]
            if not members or unknown:
                raise ValueError(f"fused group {name!r} names unknown modules {unknown or members}")
            if seen & set(members) or len(set(members)) != len(members):
                raise ValueError(f"fused group {name!r} repeats a module of another group")
            if len({self.modules[m][0] for m in members}) != 1:
                raise ValueError(f"fused group {name!r} mixes modules with different d_in")
            seen.update(members)
            checked[name] = members
        return checked

    @classmethod
    def from_hf_config(cls, config, model_name: str | None = None) -> LoRAModelSpec:
        """The spec of a Llama-family model from its Hugging Face config."""
        hidden = config.hidden_size
        heads = config.num_attention_heads
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        head_dim = getattr(config, "head_dim", None) or hidden // heads
        inter = config.intermediate_size
        q_out, kv_out = heads * head_dim, kv_heads * head_dim
        modules = {
            "q_proj": (hidden, q_out),
            "k_proj": (hidden, kv_out),
            "v_proj": (hidden, kv_out),
            "o_proj": (q_out, hidden),
            "gate_proj": (hidden, inter),
            "up_proj": (hidden, inter),
            "down_proj": (inter, hidden),
        }
        name = model_name if model_name is not None else (config.name_or_path or "")
        return cls(
            model_name=name,
            num_layers=config.num_hidden_layers,
            modules=modules,
            fused=dict(LLAMA_FUSED_GROUPS),
        )
