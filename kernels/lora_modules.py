"""The LoRA of one projection, every module of it in one call: prepared once, applied every
layer of every step.

A projection the model fuses (q/k/v, gate/up) adds each module's adapter output to that
module's own columns of the fused output; a single projection is a group of one. The
modules' stacks are views of the adapter slots, whose storage never moves, so everything a
call needs but the step's rows (shapes checked, the native kernel's table of pointers and
strides) is worked out once, when the group is prepared, rather than in each of the ~200
LoRA calls of a decode step: one call per projection instead of one per module, and no
per-module checks on the step.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ._backend import require
from .lora import _checked_index, _use_triton, lora_apply
from .lora_cpu import ModuleStruct, NativeLoRA
from .lora_groups import LoraIndex
from .lora_torch import _native


class LoRAModules:
    """The modules of one projection: per module, A ``[S, r, d_in]``, B ``[S, d_out, r]``
    and its columns of the output; all share S, r and d_in."""

    def __init__(self, modules: Sequence[tuple[torch.Tensor, torch.Tensor, slice]]):
        require(len(modules) > 0, "a projection has at least one module")
        first = modules[0][0]
        require(first.dim() == 3, f"lora_a must be 3-D, got {tuple(first.shape)}")
        self.modules = tuple(modules)
        self.num_slots, self.rank, self.d_in = first.shape
        self.dtype = first.dtype
        for a, b, columns in self.modules:
            require(
                a.dim() == 3 and b.dim() == 3,
                f"lora_a and lora_b must be 3-D, got {tuple(a.shape)} {tuple(b.shape)}",
            )
            require(
                tuple(a.shape) == (self.num_slots, self.rank, self.d_in),
                f"lora_a {tuple(a.shape)} differs from the first module's",
            )
            require(
                b.shape[0] == self.num_slots and b.shape[2] == self.rank,
                f"lora_b {tuple(b.shape)} does not match lora_a {tuple(a.shape)}",
            )
            require(
                columns.step in (None, 1) and columns.stop - columns.start == b.shape[1],
                f"columns {columns} do not hold d_out {b.shape[1]}",
            )
        self.width = max(columns.stop for _, _, columns in self.modules)
        self.table = self._native_table()

    def _native_table(self):
        """The modules as lora_cpu.c's lora_module array, where the native kernels take
        their tensors (CPU, float32 or bfloat16, contiguous rows); None otherwise."""
        stacks = [(a, b.transpose(1, 2)) for a, b, _ in self.modules]
        if not NativeLoRA.fits(*(t for pair in stacks for t in pair)):
            return None
        table = (ModuleStruct * len(stacks))()
        for entry, (a, bt), (_, _, columns) in zip(table, stacks, self.modules, strict=True):
            entry.a, entry.a_slot, entry.a_row = a.data_ptr(), a.stride(0), a.stride(1)
            entry.bt, entry.b_slot, entry.b_row = bt.data_ptr(), bt.stride(0), bt.stride(1)
            entry.d_out, entry.column = bt.shape[2], columns.start
        return table


def lora_apply_modules(
    x: torch.Tensor,
    modules: LoRAModules,
    slot_ids: torch.Tensor,
    scales: torch.Tensor,
    out: torch.Tensor,
    backend: str | None = None,
    index: LoraIndex | None = None,
) -> None:
    """For every module: out[t, columns] += scales[s] * (x[t] @ a[s]^T) @ b[s]^T, s the
    token's slot (rows with -1 untouched). x ``[T, d_in]``, out ``[T, width]`` in place."""
    require(
        x.dim() == 2 and x.shape[1] == modules.d_in,
        lambda: f"x must be [T, {modules.d_in}], got shape {tuple(x.shape)}",
    )
    require(
        out.dim() == 2 and out.shape[0] == x.shape[0] and out.shape[1] >= modules.width,
        lambda: f"out must be [{x.shape[0]}, >={modules.width}], got {tuple(out.shape)}",
    )
    index = _checked_index(index, slot_ids, x.shape[0], modules.num_slots)
    if index.num_active == 0:
        return
    if (
        modules.table is not None
        and x.dtype == modules.dtype
        and not _use_triton(backend, x, index)
    ):
        native = _native(index, x, out)
        if native is not None:
            native.apply_modules(
                x, modules.table, len(modules.modules), modules.rank, scales, out, slot_ids
            )
            return
    for a, b, columns in modules.modules:
        lora_apply(x, a, b, slot_ids, scales, out[:, columns], backend=backend, index=index)
