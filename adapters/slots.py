"""Device slots: the stacked LoRA tensors the batched kernels index by slot number.

Allocated once. Loading an adapter copies into its slot in place (padding the rank with
zeros) so tensor addresses never change and the engine can hold views (and CUDA graphs)
across loads.
"""

from __future__ import annotations

import torch

from loragate.adapters.loader import LoRAAdapter
from loragate.adapters.spec import LoRAModelSpec


class DeviceSlots:
    """Stacked slot tensors, per module.

    A is ``[layers, max_loras, max_rank, d_in]``, B ``[layers, max_loras, d_out, max_rank]``.
    """

    def __init__(self, spec: LoRAModelSpec, max_loras: int, max_rank: int, device, dtype):
        self.spec = spec
        self.max_loras = max_loras
        self.max_rank = max_rank
        self.a = {
            module: torch.zeros(
                spec.num_layers, max_loras, max_rank, d_in, device=device, dtype=dtype
            )
            for module, (d_in, _) in spec.modules.items()
        }
        self.b = {
            module: torch.zeros(
                spec.num_layers, max_loras, d_out, max_rank, device=device, dtype=dtype
            )
            for module, (_, d_out) in spec.modules.items()
        }
        self.scales = torch.zeros(max_loras, device=device, dtype=dtype)

    def write(self, slot: int, adapter: LoRAAdapter) -> None:
        """Overwrite ``slot`` with ``adapter``: one staged copy per module, zeros elsewhere."""
        by_module: dict[str, list] = {}
        for (layer, module), pair in adapter.weights.items():
            by_module.setdefault(module, []).append((layer, *pair))
        for module in self.spec.modules:
            entries = by_module.get(module)
            if not entries:
                self.a[module][:, slot].zero_()
                self.b[module][:, slot].zero_()
                continue
            d_in, d_out = self.spec.modules[module]
            staged_a = torch.zeros(self.spec.num_layers, self.max_rank, d_in)
            staged_b = torch.zeros(self.spec.num_layers, d_out, self.max_rank)
            for layer, a, b in entries:
                staged_a[layer, : a.shape[0]] = a
                staged_b[layer, :, : b.shape[1]] = b
            self.a[module][:, slot].copy_(staged_a)
            self.b[module][:, slot].copy_(staged_b)
        self.scales[slot] = adapter.scale

    def clear(self, slot: int) -> None:
        """Zero ``slot`` so nothing of a removed adapter can leak into later batches."""
        for module in self.spec.modules:
            self.a[module][:, slot].zero_()
            self.b[module][:, slot].zero_()
        self.scales[slot] = 0
