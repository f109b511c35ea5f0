"""Device slots: the stacked LoRA tensors the batched kernels index by slot number.

Allocated once. Loading an adapter copies into its slot in place (padding the rank with
zeros) so tensor addresses never change and the engine can hold views (and CUDA graphs)
across loads. Each slot remembers, per module, how many rank columns its last occupant
wrote, so a load zeroes only that much rather than the whole max-rank slot.

One stack per module: A ``[layers, max_loras, max_rank, d_in]`` and B transposed
``[layers, max_loras, max_rank, d_out]`` (rank rows, output columns: the layout CPU grouped
matmuls run fastest on). A projection the model fuses (q/k/v, gate/up) applies each of its
modules to that module's own columns of the fused output, so a step reads exactly the
weights its adapters have. (One stack per fused group, with a block-diagonal B, read M times
the B weights a group needs: on 2 cores, a third of the LoRA time of a decode step with
rank-64 adapters on every projection, and M times the slot memory.)
"""

from __future__ import annotations

import torch

from loragate import kernels
from loragate.adapters.loader import LoRAAdapter
from loragate.adapters.spec import LoRAModelSpec


class DeviceSlots:
    """Stacked slot tensors, one A and one B (transposed) per module."""

    def __init__(self, spec: LoRAModelSpec, max_loras: int, max_rank: int, device, dtype):
        self.spec = spec
        self.max_loras = max_loras
        self.max_rank = max_rank
        layers = spec.num_layers
        self.groups = spec.groups
        self.a: dict[str, torch.Tensor] = {}
        self.bt: dict[str, torch.Tensor] = {}
        for module, (d_in, d_out) in spec.modules.items():
            self.a[module] = torch.zeros(
                layers, max_loras, max_rank, d_in, device=device, dtype=dtype
            )
            self.bt[module] = torch.zeros(
                layers, max_loras, max_rank, d_out, device=device, dtype=dtype
            )
        # float32 whatever the weights' dtype: an alpha / r such as 16 / 12 is not a bf16
        # number, and the native CPU kernels read scales as float32.
        self.scales = torch.zeros(max_loras, device=device, dtype=torch.float32)
        self._module_views: dict[tuple[int, str, int], tuple] = {}
        self._module_groups: dict[tuple[int, str, int], kernels.LoRAModules] = {}
        # Rank columns that may be non-zero, per module and slot.
        self._dirty = {module: [0] * max_loras for module in spec.modules}

    # -- views the model and the tests read ---------------------------------------------
    def module_weights(self, layer: int, group: str, rank: int):
        """Per module of a group, cut to ``rank``: A ``[max_loras, rank, d_in]``, B
        ``[max_loras, d_out, rank]`` and the module's columns of the group's fused output.
        Views, made once (the engine asks for them every layer of every step, and the
        storage never moves)."""
        key = (layer, group, rank)
        views = self._module_views.get(key)
        if views is None:
            made, offset = [], 0
            for module in self.groups[group]:
                a = self.module_a(layer, module)[:, :rank]
                b = self.module_b(layer, module)[:, :, :rank]
                made.append((a, b, slice(offset, offset + b.shape[1])))
                offset += b.shape[1]
            views = self._module_views[key] = tuple(made)
        return views

    def module_group(self, layer: int, group: str, rank: int) -> kernels.LoRAModules:
        """`module_weights` prepared for kernels.lora_apply_modules: the whole group in one
        call. Made once per layer, group and rank, like the views it holds."""
        key = (layer, group, rank)
        prepared = self._module_groups.get(key)
        if prepared is None:
            prepared = kernels.LoRAModules(self.module_weights(layer, group, rank))
            self._module_groups[key] = prepared
        return prepared

    def module_a(self, layer: int, module: str) -> torch.Tensor:
        """``[max_loras, max_rank, d_in]``: one module's A, a view."""
        return self.a[module][layer]

    def module_b(self, layer: int, module: str) -> torch.Tensor:
        """``[max_loras, d_out, max_rank]``: one module's B, a view."""
        return self.bt[module][layer].transpose(1, 2)

    # -- loading ------------------------------------------------------------------------
    def write(self, slot: int, adapter: LoRAAdapter) -> None:
        """Overwrite ``slot`` with ``adapter``: its weights, zeros everywhere else."""
        by_module: dict[str, list] = {}
        for (layer, module), (a, b) in sorted(adapter.weights.items()):
            by_module.setdefault(module, []).append((layer, a, b))
        for module in self.spec.modules:
            self._write_module(slot, module, adapter, by_module.get(module, []))
        self.scales[slot] = adapter.scale

    def _write_module(self, slot: int, module: str, adapter: LoRAAdapter, entries) -> None:
        stacked = adapter.stacked.get(module)
        if stacked is not None and self._covers(module, slot, stacked):
            # Every rank row that may be non-zero is overwritten: no zeroing first.
            first, a_stack, bt_stack = stacked
            a_all, bt_all = self._views(module, slot)
            run, r = slice(first, first + a_stack.shape[0]), a_stack.shape[1]
            a_all[run, :r].copy_(a_stack)
            bt_all[run, :r].copy_(bt_stack)
            self._dirty[module][slot] = r
            return
        self._zero(module, slot)
        if entries:
            self._copy(module, slot, entries)
            self._dirty[module][slot] = max(a.shape[0] for _, a, _ in entries)

    def clear(self, slot: int) -> None:
        """Zero ``slot`` so nothing of a removed adapter can leak into later batches."""
        for module in self.spec.modules:
            self._zero(module, slot)
        self.scales[slot] = 0

    def _views(self, module: str, slot: int) -> tuple[torch.Tensor, torch.Tensor]:
        """All layers of one module in one slot: A ``[L, R, d_in]``, Bt ``[L, R, d_out]``."""
        return self.a[module][:, slot], self.bt[module][:, slot]

    def _covers(self, module: str, slot: int, stacked) -> bool:
        """Whether writing `stacked` overwrites all of the slot's possibly non-zero rows."""
        first, a_stack, _ = stacked
        return (
            first == 0
            and a_stack.shape[0] == self.spec.num_layers
            and a_stack.shape[1] >= self._dirty[module][slot]
        )

    def _zero(self, module: str, slot: int) -> None:
        dirty = self._dirty[module][slot]
        if dirty:
            a, bt = self._views(module, slot)
            a[:, :dirty].zero_()
            bt[:, :dirty].zero_()
            self._dirty[module][slot] = 0

    def _copy(self, module: str, slot: int, entries: list) -> None:
        a_all, bt_all = self._views(module, slot)
        layers = [layer for layer, _, _ in entries]
        ranks = {a.shape[0] for _, a, _ in entries}
        first, last = layers[0], layers[-1]
        if len(ranks) == 1 and layers == list(range(first, last + 1)):
            # The usual case (one rank, a run of layers): one copy per tensor.
            r = ranks.pop()
            run = slice(first, last + 1)
            a_all[run, :r].copy_(torch.stack([a for _, a, _ in entries]))
            bt_all[run, :r].copy_(torch.stack([b.T for _, _, b in entries]))
            return
        for layer, a, b in entries:
            a_all[layer, : a.shape[0]].copy_(a)
            bt_all[layer, : b.shape[1]].copy_(b.T)
