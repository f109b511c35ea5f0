"""What the base model offers LoRA: which linear layers, their shapes, how many layers.

The model declares it (engine/models/llama.py: ``lora_spec``) and hands it to the adapter
layer as data; nothing here knows a model family.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class LoRAModelSpec:
    """The engine's model as the adapter layer sees it; built once by the engine.

    ``modules`` maps each LoRA-targetable module name to ``(d_in, d_out)``. ``fused`` names
    groups of modules the model runs as one matmul on one input (same d_in); their output
    columns follow the group's module order. Every other module is a group of its own.
    ``base_weight(layer, module)`` reads one base weight ``[d_out, d_in]`` in float32 from the
    model's checkpoint, for what an adapter derives from it when loaded (DoRA's norms); None
    where the model cannot say (DoRA adapters are then refused).
    """

    model_name: str
    num_layers: int
    modules: dict[str, tuple[int, int]] = field(hash=False)
    fused: dict[str, tuple[str, ...]] = field(default_factory=dict, hash=False)
    base_weight: Callable[[int, str], torch.Tensor] | None = field(
        default=None, hash=False, compare=False, repr=False
    )
    # The vocabulary side, for adapters on embed_tokens and lm_head (LoRA, whole copies,
    # trainable tokens): 0 where the model offers none.
    vocab_size: int = 0
    hidden_size: int = 0
    tied_embeddings: bool = False

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
            if not isinstance(name, str) or not name:
                raise ValueError(f"module names must be non-empty strings, got {name!r}")
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
