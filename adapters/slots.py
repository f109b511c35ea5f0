"""Device slots: the stacked LoRA tensors the batched kernels index by slot number.

Allocated once. Loading an adapter copies into its slot in place (padding the rank with
zeros) so tensor addresses never change and the engine can hold views (and CUDA graphs)
across loads. Each slot remembers, per module, how many rank columns its last occupant
wrote, so a load zeroes only that much rather than the whole max-rank slot.
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
        layers = spec.num_layers
        self.a = {
            module: torch.zeros(layers, max_loras, max_rank, d_in, device=device, dtype=dtype)
            for module, (d_in, _) in spec.modules.items()
        }
        self.b = {
            module: torch.zeros(layers, max_loras, d_out, max_rank, device=device, dtype=dtype)
            for module, (_, d_out) in spec.modules.items()
        }
        self.scales = torch.zeros(max_loras, device=device, dtype=dtype)
        # Rank columns that may be non-zero, per module and slot.
        self._dirty = {module: [0] * max_loras for module in spec.modules}

    def write(self, slot: int, adapter: LoRAAdapter) -> None:
        """Overwrite ``slot`` with ``adapter``: its weights, zeros everywhere else."""
        by_module: dict[str, list] = {}
        for (layer, module), (a, b) in sorted(adapter.weights.items()):
            by_module.setdefault(module, []).append((layer, a, b))
        for module in self.spec.modules:
            self._zero(module, slot)
            entries = by_module.get(module, [])
            if entries:
                self._copy(module, slot, entries)
                self._dirty[module][slot] = max(a.shape[0] for _, a, _ in entries)
        self.scales[slot] = adapter.scale

    def clear(self, slot: int) -> None:
        """Zero ``slot`` so nothing of a removed adapter can leak into later batches."""
        for module in self.spec.modules:
            self._zero(module, slot)
        self.scales[slot] = 0

    def _zero(self, module: str, slot: int) -> None:
        dirty = self._dirty[module][slot]
        if dirty:
            self.a[module][:, slot, :dirty].zero_()
            self.b[module][:, slot, :, :dirty].zero_()
            self._dirty[module][slot] = 0

    def _copy(self, module: str, slot: int, entries: list) -> None:
        layers = [layer for layer, _, _ in entries]
        ranks = {a.shape[0] for _, a, _ in entries}
        first, last = layers[0], layers[-1]
        if len(ranks) == 1 and layers == list(range(first, last + 1)):
            # The usual case (one rank, a run of layers): one copy per tensor.
            r = ranks.pop()
            run = slice(first, last + 1)
            self.a[module][run, slot, :r].copy_(torch.stack([a for _, a, _ in entries]))
            self.b[module][run, slot, :, :r].copy_(torch.stack([b for _, _, b in entries]))
            return
        for layer, a, b in entries:
            self.a[module][layer, slot, : a.shape[0]].copy_(a)
            self.b[module][layer, slot, :, : b.shape[1]].copy_(b)
