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

On the CPU the slots and the CPU tier are the same memory, so a slot *borrows* its adapter's
rows where it can (``borrow=True``): each module whose layers the CPU tier holds as one
stack in the slots' dtype (LoRAAdapter.stacked) is read in place by the kernels, through a
pointer per slot (kernels/lora_modules.py), and putting an adapter in a slot copies nothing
(a rank-64 adapter on every projection of the default model is 78 MB: 7-30 ms of copying,
on the step that admits its request, measured on 2 cores). Modules held otherwise are
copied into the stacks as on a GPU.
"""

from __future__ import annotations

import math
import mmap
from typing import NamedTuple

import torch

from loragate import kernels
from loragate.adapters.loader import LoRAAdapter
from loragate.adapters.pacing import UNPACED, LoadPacing
from loragate.adapters.slot_copies import SlotCopies
from loragate.adapters.spec import LoRAModelSpec


class DeviceSlots:
    """Stacked slot tensors, one A and one B (transposed) per module."""

    def __init__(
        self,
        spec: LoRAModelSpec,
        max_loras: int,
        max_rank: int,
        device,
        dtype,
        borrow: bool = False,
        copies: SlotCopies | None = None,
    ):
        self.spec = spec
        self.max_loras = max_loras
        self.max_rank = max_rank
        self.device, self.dtype = torch.device(device), dtype
        # Slots read the CPU tier's stacks in place (the CPU only: the kernels read them
        # through host pointers).
        self.borrow = borrow and self.device.type == "cpu"
        # How copied rows are written: on a GPU beside the step (adapters/slot_copies.py).
        self.copies = copies or SlotCopies.for_device(spec.num_layers, self.device)
        # slot -> module -> (first layer, A [L, r, d_in], B transposed [L, r, d_out]): the
        # borrowed stacks each slot reads instead of its own rows.
        self._borrowed: dict[int, dict[str, tuple]] = {}
        # slot -> the rows its adapter's loader checked for each group (`prepare`).
        self._prepared: dict[int, dict] = {}
        layers = spec.num_layers
        self.groups = spec.groups
        self.a: dict[str, torch.Tensor] = {}
        self.bt: dict[str, torch.Tensor] = {}
        for module, (d_in, d_out) in spec.modules.items():
            self.a[module] = self._zeros((layers, max_loras, max_rank, d_in))
            self.bt[module] = self._zeros((layers, max_loras, max_rank, d_out))
        # float32 whatever the weights' dtype: an alpha / r such as 16 / 12 is not a bf16
        # number, and the native CPU kernels read scales as float32.
        self.scales = torch.zeros(max_loras, device=device, dtype=torch.float32)
        self._module_views: dict[tuple[int, str, int], tuple] = {}
        self._module_groups: dict[tuple[int, str, int], kernels.LoRAModules] = {}
        # Rank columns that may be non-zero, per module and slot.
        self._dirty = {module: [0] * max_loras for module in spec.modules}
        # What DoRA and lora_B-bias adapters do to their rows' outputs besides B A x, per
        # module: a scale ``[layers, max_loras, d_out]`` (ones where a slot has none) and a
        # bias (zeros), made when the first such adapter is written; and the slots that
        # have either (slot -> the adapter's kind).
        self.row_scale: dict[str, torch.Tensor] = {}
        self.row_bias: dict[str, torch.Tensor] = {}
        self.extra_slots: dict[int, str] = {}
        # slot -> its adapter's vocabulary side (adapters/vocab_extras.py), on this device:
        # read in place on a CPU, copied once on a GPU; but its lm_head LoRA, which sits in
        # the head stacks below, so the batched LoRA kernels add it for every slot at once.
        self.vocab_extras: dict = {}
        # lm_head LoRA per slot, float32 as the logits: A [max_loras, max_rank, hidden] and B
        # transposed [max_loras, max_rank, vocab] (made when the first one is written; zero
        # rows elsewhere), its scale (0: none) and rank.
        self.head_a: torch.Tensor | None = None
        self.head_bt: torch.Tensor | None = None
        self.head_scales = torch.zeros(max_loras, device=device, dtype=torch.float32)
        self.head_rank = [0] * max_loras
        if self.borrow:  # one group per layer and projection: made now, none on a step
            for layer in range(layers):
                for group in self.groups:
                    self.module_group(layer, group, max_rank)

    @property
    def stack_dtype(self) -> torch.dtype:
        """The dtype the CPU tier stacks an adapter's modules in (LoRAAdapter.stacked): the
        slots' own where they borrow the stacks (a CPU) or copy them beside the step (a GPU:
        a copy from pinned memory in the same dtype runs asynchronously, where one that
        converts goes through a pageable temporary first); float32 otherwise."""
        if self.borrow or self.device.type == "cuda":
            return self.dtype
        return torch.float32

    def _zeros(self, shape: tuple[int, ...], dtype: torch.dtype | None = None) -> torch.Tensor:
        """Zeros. Where slots borrow, in an anonymous mapping, whose pages take memory only
        once written: a slot that borrows its rows never writes its own (for the default
        model, rank 64 and 8 slots, 625 MB of float32 otherwise)."""
        dtype = dtype or self.dtype
        count = math.prod(shape)
        if not self.borrow or count == 0:
            return torch.zeros(shape, device=self.device, dtype=dtype)
        pages = mmap.mmap(-1, count * dtype.itemsize)
        return torch.frombuffer(pages, dtype=dtype, count=count).view(shape)

    @property
    def vocab_slots(self) -> set[int]:
        """The slots whose adapter has a vocabulary side (kept per slot or an lm_head LoRA)."""
        return {*self.vocab_extras, *(s for s, r in enumerate(self.head_rank) if r)}

    def head_lora(self):
        """The lm_head LoRA of every slot, cut to the largest rank resident: A ``[S, r,
        hidden]``, B ``[S, vocab, r]`` (views, float32) and the scales ``[S]`` (0 for a slot
        with none); None while no slot has one."""
        rank = max(self.head_rank)
        if not rank:
            return None
        a, bt = self.head_a[:, :rank], self.head_bt[:, :rank]
        return a, bt.transpose(1, 2), self.head_scales

    def _write_head_lora(self, slot: int, vocab) -> None:
        """The slot's lm_head LoRA: ``vocab``'s (A ``[r, hidden]``, B ``[vocab, r]``, scale),
        or none (zero rows, scale 0)."""
        lora = vocab.head_lora if vocab is not None else None
        old = self.head_rank[slot]
        if old:
            self.head_a[slot, :old].zero_()
            self.head_bt[slot, :old].zero_()
        self.head_rank[slot], self.head_scales[slot] = 0, 0.0
        if lora is None:
            return
        a, b, scale = lora
        rank, hidden = a.shape
        if rank > self.max_rank:
            raise ValueError(f"lm_head LoRA rank {rank} is above max_lora_rank {self.max_rank}")
        if self.head_a is None:
            self.head_a = self._zeros((self.max_loras, self.max_rank, hidden), torch.float32)
            self.head_bt = self._zeros((self.max_loras, self.max_rank, b.shape[0]), torch.float32)
        self.head_a[slot, :rank].copy_(a)
        self.head_bt[slot, :rank].copy_(b.T)
        self.head_rank[slot], self.head_scales[slot] = rank, scale

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
        call. Made once per layer, group and rank, like the views it holds. With ``borrow``
        every slot written is placed (each reads its own rows or borrowed ones at their own
        rank), so one group at max_rank serves every rank."""
        key = (layer, group, self.max_rank if self.borrow else rank)
        prepared = self._module_groups.get(key)
        if prepared is None:
            prepared = kernels.LoRAModules(self.module_weights(*key))
            for slot in self._borrowed:
                prepared.place(slot, self._placement(layer, group, slot))
            self._module_groups[key] = prepared
        return prepared

    def module_a(self, layer: int, module: str) -> torch.Tensor:
        """``[max_loras, max_rank, d_in]``: one module's A, a view."""
        return self.a[module][layer]

    def module_b(self, layer: int, module: str) -> torch.Tensor:
        """``[max_loras, d_out, max_rank]``: one module's B, a view."""
        return self.bt[module][layer].transpose(1, 2)

    # -- loading ------------------------------------------------------------------------
    def prepare(self, adapter: LoRAAdapter, pacing: LoadPacing = UNPACED) -> None:
        """Work out, before ``adapter`` is put in any slot (on the thread that loaded it),
        the rows each group of each layer will read of it where it borrows them, checked for
        the kernels (kernels.slot_rows), and keep them on the adapter (``slot_rows``): then
        `write`, on the step that admits the adapter's first request, only points each group
        at them. Groups with a module the adapter has rows for that are not borrowed (copied
        into the slot, whose rows depend on the slot) are left to `write`."""
        if not self.borrow:
            return
        borrowed = {m: s for m, s in adapter.stacked.items() if self._can_borrow(s)}
        copied = {module for _, module in adapter.weights} - set(borrowed)
        shapes = {  # group -> its d_in and each module's d_out, where none is copied
            group: (self.spec.modules[modules[0]][0], [self.spec.modules[m][1] for m in modules])
            for group, modules in self.groups.items()
            if not copied.intersection(modules)
        }
        prepared = {}
        for layer in pacing.paced(range(self.spec.num_layers), every=4):
            for group, (d_in, d_outs) in shapes.items():
                modules = self.groups[group]
                rows = [_layer_rows(borrowed[m], layer) if m in borrowed else None for m in modules]
                prepared[(layer, group)] = kernels.slot_rows(
                    rows, d_in, d_outs, self.max_rank, self.dtype, self.device
                )
        adapter.slot_rows.update(prepared)

    def write(self, slot: int, adapter: LoRAAdapter) -> None:
        """Overwrite ``slot`` with ``adapter``: its weights, zeros everywhere else. With
        ``borrow``, the modules the CPU tier stacks in this dtype are read where they are
        (through the rows `prepare` worked out, where it did). The other modules' rows are
        written through `copies` (adapters/slot_copies.py): on a GPU a layer at a time on a
        side stream, the step waiting for each layer where it reads it (`ready`)."""
        borrowed, plans = {}, {}
        for module in self.spec.modules:
            stacked = adapter.stacked.get(module)
            if self._can_borrow(stacked):
                borrowed[module] = stacked  # its own rows stay as they are, unread
            else:
                plans[module] = self._plan(module, slot, adapter, stacked)
        self.copies.run(lambda layers: self._write_layers(slot, plans, layers))
        for module, plan in plans.items():
            self._dirty[module][slot] = plan.rank
        self._borrow(slot, borrowed, adapter.slot_rows)
        self.scales[slot] = adapter.scale
        self._write_row_extras(slot, adapter)
        self._write_head_lora(slot, adapter.vocab)
        rest = adapter.vocab.without_head_lora() if adapter.vocab is not None else None
        if rest is not None:
            self.vocab_extras[slot] = rest.to(self.device, self.dtype)
        else:
            self.vocab_extras.pop(slot, None)

    def ready(self, layer: int) -> None:
        """The step waits here for ``layer``'s pending copies (on a GPU; nothing elsewhere):
        the forward calls it before it reads the layer's slots."""
        self.copies.ready(layer)

    def wait_all(self) -> None:
        """The step waits for every pending copy (before a CUDA graph's replay)."""
        self.copies.wait_all()

    def _write_row_extras(self, slot: int, adapter: LoRAAdapter) -> None:
        """The slot's DoRA scales and lora_B biases: the adapter's, or none (ones, zeros)."""
        for table, values, neutral in (
            (self.row_scale, adapter.row_scales, 1.0),
            (self.row_bias, adapter.row_biases, 0.0),
        ):
            if values and not table:
                for module, (_, d_out) in self.spec.modules.items():
                    shape = (self.spec.num_layers, self.max_loras, d_out)
                    table[module] = torch.full(
                        shape, neutral, device=self.device, dtype=torch.float32
                    )
            for rows in table.values():
                rows[:, slot] = neutral
            for (layer, module), vector in values.items():
                table[module][layer, slot].copy_(vector)
        if adapter.row_scales or adapter.row_biases:
            self.extra_slots[slot] = adapter.kind
        else:
            self.extra_slots.pop(slot, None)

    def row_extras(self, layer: int, group: str):
        """Per module of ``group``: its columns of the group's output, and its DoRA scales
        and lora_B biases ``[max_loras, d_out]`` (None where no slot has any)."""
        out, offset = [], 0
        for module in self.groups[group]:
            d_out = self.spec.modules[module][1]
            scale = self.row_scale[module][layer] if self.row_scale else None
            bias = self.row_bias[module][layer] if self.row_bias else None
            out.append((slice(offset, offset + d_out), scale, bias))
            offset += d_out
        return out

    def _can_borrow(self, stacked) -> bool:
        if not self.borrow or stacked is None:
            return False
        _, a_stack, bt_stack = stacked
        return (
            all(
                t.dtype == self.dtype and t.device == self.device and t.is_contiguous()
                for t in (a_stack, bt_stack)
            )
            and a_stack.shape[1] <= self.max_rank
        )

    def _borrow(self, slot: int, borrowed: dict[str, tuple], prepared=None) -> None:
        """With ``borrow``, place ``slot`` in every group: the rows it borrows, and its own
        rows (copied ones) at the rank written; ``prepared``: the adapter's rows `prepare`
        checked, by layer and group."""
        if not self.borrow:
            return
        self._borrowed[slot] = borrowed
        self._prepared[slot] = prepared or {}
        for (layer, group, _), modules in self._module_groups.items():
            modules.place(slot, self._placement(layer, group, slot))

    def _placement(self, layer: int, group: str, slot: int):
        """What ``slot`` is placed at in one group: the rows `prepare` checked for it, or
        else `_rows`."""
        rows = self._prepared[slot].get((layer, group))
        return rows if rows is not None else self._rows(layer, group, slot)

    def _rows(self, layer: int, group: str, slot: int) -> tuple:
        """Per module of ``group``, the rows ``slot`` reads in ``layer``: borrowed ones, or
        its own cut to the rank columns written; None where it adds nothing."""
        borrowed = self._borrowed[slot]
        rows = []
        for module in self.groups[group]:
            rank = self._dirty[module][slot]
            if module in borrowed:
                rows.append(_layer_rows(borrowed[module], layer))
            elif rank:
                rows.append(
                    (self.a[module][layer, slot, :rank], self.bt[module][layer, slot, :rank])
                )
            else:
                rows.append(None)
        return tuple(rows)

    def _plan(self, module: str, slot: int, adapter: LoRAAdapter, stacked) -> _ModuleWrite:
        """How ``adapter``'s rows of ``module`` are written into ``slot``: a stack that
        overwrites every rank row that may be non-zero, or else zeros then its layers'
        rows."""
        if stacked is not None and self._covers(module, slot, stacked):
            return _ModuleWrite(stacked, 0, {}, stacked[1].shape[1])
        entries = {layer: ab for (layer, m), ab in adapter.weights.items() if m == module}
        rank = max((a.shape[0] for a, _ in entries.values()), default=0)
        return _ModuleWrite(None, self._dirty[module][slot], entries, rank)

    def _write_layers(self, slot: int, plans: dict[str, _ModuleWrite], layers: range) -> None:
        """The planned rows of ``layers`` (a run), every module."""
        run = slice(layers.start, layers.stop)
        for module, plan in plans.items():
            a_all, bt_all = self._views(module, slot)
            if plan.stacked is not None:
                _, a_stack, bt_stack = plan.stacked
                a_all[run, : plan.rank].copy_(a_stack[run], non_blocking=True)
                bt_all[run, : plan.rank].copy_(bt_stack[run], non_blocking=True)
                continue
            if plan.zero:
                a_all[run, : plan.zero].zero_()
                bt_all[run, : plan.zero].zero_()
            entries = [(layer, *plan.entries[layer]) for layer in layers if layer in plan.entries]
            if entries:
                _copy(a_all, bt_all, entries)

    def clear(self, slot: int) -> None:
        """Zero ``slot`` so nothing of a removed adapter can leak into later batches."""
        for module in self.spec.modules:
            self._zero(module, slot)
        self._borrow(slot, {})
        self.scales[slot] = 0
        for table, neutral in ((self.row_scale, 1.0), (self.row_bias, 0.0)):
            for rows in table.values():
                rows[:, slot] = neutral
        self.extra_slots.pop(slot, None)
        self.vocab_extras.pop(slot, None)
        self._write_head_lora(slot, None)

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


def _layer_rows(stacked: tuple, layer: int):
    """One layer of a stacked module: (A [r, d_in], B transposed [r, d_out]), or None when
    the stack does not cover ``layer``."""
    first, a_stack, bt_stack = stacked
    if not first <= layer < first + a_stack.shape[0]:
        return None
    return a_stack[layer - first], bt_stack[layer - first]


class _ModuleWrite(NamedTuple):
    """One module's write into a slot (DeviceSlots._plan): a stack covering the slot's
    dirty rows, copied as is; or the rank columns to zero first and the rows per layer."""

    stacked: tuple | None
    zero: int
    entries: dict
    rank: int  # the rank columns it leaves possibly non-zero


def _copy(a_all: torch.Tensor, bt_all: torch.Tensor, entries: list) -> None:
    """Each (layer, A, B) into one slot's views of all layers (``DeviceSlots._views``)."""
    layers = [layer for layer, _, _ in entries]
    ranks = {a.shape[0] for _, a, _ in entries}
    first, last = layers[0], layers[-1]
    if len(ranks) == 1 and layers == list(range(first, last + 1)):
        # The usual case (one rank, a run of layers): one copy per tensor.
        r = ranks.pop()
        run = slice(first, last + 1)
        a_all[run, :r].copy_(torch.stack([a for _, a, _ in entries]), non_blocking=True)
        bt_all[run, :r].copy_(torch.stack([b.T for _, _, b in entries]), non_blocking=True)
        return
    for layer, a, b in entries:
        a_all[layer, : a.shape[0]].copy_(a, non_blocking=True)
        bt_all[layer, : b.shape[1]].copy_(b.T, non_blocking=True)
