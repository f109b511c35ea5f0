"""Device slots: the stacked LoRA tensors the batched kernels index by slot number.

Allocated once. Loading an adapter copies into its slot in place (padding the rank with
zeros) so tensor addresses never change and the engine can hold views (and CUDA graphs)
across loads. Each slot remembers, per module, how many rank columns its last occupant
wrote, so a load zeroes only that much rather than the whole max-rank slot.

Modules the model fuses (q/k/v, gate/up) share one stack per group, so one shrink and one
expand serve the fused projection. Their rank axis is rank-major, module-minor: cutting it
to the resident rank r keeps a group's A viewable as ``[S, r*M, d_in]`` and its B as
``[S, r*M, D]`` with no copy. B is stored transposed (rank rows, output columns), the layout
CPU grouped matmuls run fastest on, and block-diagonal: module m's output columns read only
its own rank rows. The zero blocks cost (M-1)/M more B memory for a fused group.
"""

from __future__ import annotations

import torch

from loragate.adapters.loader import LoRAAdapter
from loragate.adapters.spec import LoRAModelSpec


class DeviceSlots:
    """Stacked slot tensors, per module group.

    A group of M modules with input size d_in and fused output size D has
    A ``[layers, max_loras, max_rank, M, d_in]`` and Bt ``[layers, max_loras, max_rank, M, D]``.
    """

    def __init__(self, spec: LoRAModelSpec, max_loras: int, max_rank: int, device, dtype):
        self.spec = spec
        self.max_loras = max_loras
        self.max_rank = max_rank
        layers = spec.num_layers
        self.groups = spec.groups
        # module -> (group, index in group, first output column, d_out)
        self._place: dict[str, tuple[str, int, int, int]] = {}
        self.a: dict[str, torch.Tensor] = {}
        self.bt: dict[str, torch.Tensor] = {}
        for group, members in self.groups.items():
            offset = 0
            for index, module in enumerate(members):
                d_out = spec.modules[module][1]
                self._place[module] = (group, index, offset, d_out)
                offset += d_out
            d_in, m = spec.modules[members[0]][0], len(members)
            self.a[group] = torch.zeros(
                layers, max_loras, max_rank, m, d_in, device=device, dtype=dtype
            )
            self.bt[group] = torch.zeros(
                layers, max_loras, max_rank, m, offset, device=device, dtype=dtype
            )
        # float32 whatever the weights' dtype: an alpha / r such as 16 / 12 is not a bf16
        # number, and the native CPU kernels read scales as float32.
        self.scales = torch.zeros(max_loras, device=device, dtype=torch.float32)
        self._group_views: dict[tuple[int, str, int], tuple[torch.Tensor, torch.Tensor]] = {}
        # Rank columns that may be non-zero, per module and slot.
        self._dirty = {module: [0] * max_loras for module in spec.modules}

    # -- views the model and the tests read ---------------------------------------------
    def group_weights(self, layer: int, group: str, rank: int):
        """A ``[max_loras, rank*M, d_in]`` and block-diagonal B ``[max_loras, D, rank*M]`` of a
        group cut to ``rank``: views, made once (the engine asks for them every layer of every
        step, and the storage never moves)."""
        key = (layer, group, rank)
        views = self._group_views.get(key)
        if views is None:
            a = self.a[group][layer, :, :rank].flatten(1, 2)
            b = self.bt[group][layer, :, :rank].flatten(1, 2).transpose(1, 2)
            views = self._group_views[key] = (a, b)
        return views

    def module_a(self, layer: int, module: str) -> torch.Tensor:
        """``[max_loras, max_rank, d_in]``: one module's A, a view."""
        group, index, _, _ = self._place[module]
        return self.a[group][layer, :, :, index]

    def module_b(self, layer: int, module: str) -> torch.Tensor:
        """``[max_loras, d_out, max_rank]``: one module's B, a view."""
        group, index, offset, d_out = self._place[module]
        return self.bt[group][layer, :, :, index, offset : offset + d_out].transpose(1, 2)

    # -- loading ------------------------------------------------------------------------
    def write(self, slot: int, adapter: LoRAAdapter) -> None:
        """Overwrite ``slot`` with ``adapter``: its weights, zeros everywhere else."""
        by_module: dict[str, list] = {}
        for (layer, module), (a, b) in sorted(adapter.weights.items()):
            by_module.setdefault(module, []).append((layer, a, b))
        for module in self.spec.modules:
            entries = by_module.get(module, [])
            stacked = adapter.stacked.get(module)
            if stacked is not None and self._covers(module, slot, stacked):
                # Every rank row that may be non-zero is overwritten: no zeroing first.
                first, a_stack, bt_stack = stacked
                a_all, bt_all = self._views(module, slot)
                run, r = slice(first, first + a_stack.shape[0]), a_stack.shape[1]
                a_all[run, :r].copy_(a_stack)
                bt_all[run, :r].copy_(bt_stack)
                self._dirty[module][slot] = r
                continue
            self._zero(module, slot)
            if entries:
                self._copy(module, slot, entries)
                self._dirty[module][slot] = max(a.shape[0] for _, a, _ in entries)
        self.scales[slot] = adapter.scale

    def clear(self, slot: int) -> None:
        """Zero ``slot`` so nothing of a removed adapter can leak into later batches."""
        for module in self.spec.modules:
            self._zero(module, slot)
        self.scales[slot] = 0

    def _views(self, module: str, slot: int) -> tuple[torch.Tensor, torch.Tensor]:
        """All layers of one module in one slot: A ``[L, R, d_in]``, Bt ``[L, R, d_out]``."""
        group, index, offset, d_out = self._place[module]
        a = self.a[group][:, slot, :, index]
        bt = self.bt[group][:, slot, :, index, offset : offset + d_out]
        return a, bt

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
