"""The LoRA of one projection, every module of it in one call: prepared once, applied every
layer of every step.

A projection the model fuses (q/k/v, gate/up) adds each module's adapter output to that
module's own columns of the fused output; a single projection is a group of one. The
modules' stacks are views of the adapter slots, whose storage never moves, so everything a
call needs but the step's rows (shapes checked, the native kernel's table of pointers and
strides, from how many rows of one slot a product beats the per-token loop) is worked out
once, when the group is prepared, rather than in each of the ~200 LoRA calls of a decode
step: one call per projection instead of one per module, and no per-module checks on the
step.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ._backend import require
from .lora import _checked_index, _use_triton, lora_apply
from .lora_cpu import TILES_REFUSED, ModuleStruct, NativeLoRA
from .lora_groups import LoraIndex
from .lora_segment_gemm import (
    apply_long_segments,
    gemm_min_rows,
    gemm_row_ranks,
    long_segments,
    tile_min_rows,
    tile_row_ranks,
    worth_a_product,
)
from .lora_torch import _native


@dataclass(frozen=True)
class SlotRows:
    """One slot's rows for one group, checked: made by `slot_rows` (or by
    `LoRAModules.place` from plain rows). ``cut``: per module, (A ``[r, d_in]``, B
    transposed ``[r, d_out]``) cut to the group's rank, or None; ``own_rank``: the most rank
    rows any module reads; ``pointers``: per module, the addresses and rank the native table
    takes ((None, None, 0) where it adds nothing); ``fits``: the group it was checked for
    (d_in, each module's d_out, rank, dtype, device)."""

    cut: tuple
    own_rank: int
    pointers: tuple
    fits: tuple


def slot_rows(
    rows: Sequence, d_in: int, d_outs: Sequence[int], rank: int, dtype, device
) -> SlotRows:
    """``rows`` checked, ahead of time, for every group of modules with these shapes: each
    module's A and B transposed contiguous, in ``dtype`` on ``device``. An adapter loader
    makes them off the engine's step, so that `LoRAModules.place` on the step only writes
    pointers (placing a slot in the ~120 groups of the default model took 8-9 ms of the step
    that admits its adapter, on a 2-core Xeon)."""
    return _checked(tuple(rows), d_in, tuple(d_outs), rank, dtype, torch.device(device), True)


def _checked(rows: tuple, d_in, d_outs, rank, dtype, device, whole_rows: bool) -> SlotRows:
    require(
        len(rows) == len(d_outs),
        lambda: f"{len(rows)} modules' rows for a group of {len(d_outs)}",
    )
    cut = []
    for entry, d_out in zip(rows, d_outs, strict=True):
        if entry is not None:
            _check_entry(entry, d_in, d_out, dtype, device, whole_rows)
            a, bt = entry
            entry = entry if a.shape[0] <= rank else (a[:rank], bt[:rank])
        cut.append(entry)
    pointers = tuple(
        (None, None, 0)
        if entry is None
        else (entry[0].data_ptr(), entry[1].data_ptr(), len(entry[0]))
        for entry in cut
    )
    own_rank = max(ranks for _, _, ranks in pointers) if pointers else 0
    return SlotRows(tuple(cut), own_rank, pointers, (d_in, d_outs, rank, dtype, device))


def _check_entry(entry, d_in: int, d_out: int, dtype, device, whole_rows: bool) -> None:
    a, bt = entry
    a_shape, bt_shape = a.shape, bt.shape
    require(
        len(a_shape) == 2 and len(bt_shape) == 2 and a_shape[1] == d_in and bt_shape[1] == d_out,
        lambda: (
            f"a slot's rows must be A [r, {d_in}] and B transposed [r, {d_out}], "
            f"got {tuple(a_shape)} {tuple(bt_shape)}"
        ),
    )
    require(a_shape[0] == bt_shape[0], lambda: f"A has {a_shape[0]} rows and B {bt_shape[0]}")
    require(
        a.dtype == dtype and bt.dtype == dtype and a.device == device and bt.device == device,
        lambda: f"a slot's rows must be {dtype} on {device}",
    )
    a_strides, bt_strides = a.stride(), bt.stride()
    require(
        a_strides[1] == 1 and bt_strides[1] == 1,
        "a slot's rows must be contiguous in their last dimension",
    )
    if whole_rows:  # the native kernels read every slot's rows alike
        require(
            a_strides[0] == d_in and bt_strides[0] == d_out,
            lambda: f"a slot's rows must be contiguous, got strides {a_strides} {bt_strides}",
        )


class LoRAModules:
    """The modules of one projection: per module, A ``[S, r, d_in]``, B ``[S, d_out, r]``
    and its columns of the output; all share S, r and d_in.

    A slot reads its rows from those stacks unless `place` says they are elsewhere (the CPU
    tier's copy of an adapter, adapters/slots.py): then each module of that slot reads its
    own A ``[r_s, d_in]`` and B transposed ``[r_s, d_out]``, their first ``rank`` rows at most,
    as the stacks are cut to ``rank``.

    ``gemm_rows``: from how many consecutive rows of one slot the native path runs them as
    products (lora_segment_gemm.py); 0 never; None (the default) as this CPU and
    LORAGATE_LORA_GEMM_ROWS say for the group's dtype, read here once, with the rows times
    a slot's own rank such a run needs besides (``gemm_row_ranks``; None: rows alone).
    ``tile_rows``: from how many rows of one slot a bf16 run goes to tiles inside the native
    call (lora_tiles.h); 0 never; None as this CPU (AMX) and LORAGATE_LORA_TILE_ROWS say,
    with the rows times a slot's own rank such a run needs besides (``tile_row_ranks``).
    Where the tiles take runs, products take none unless ``gemm_rows`` (or
    LORAGATE_LORA_GEMM_ROWS) asks for them.
    """

    def __init__(
        self,
        modules: Sequence[tuple[torch.Tensor, torch.Tensor, slice]],
        gemm_rows: int | None = None,
        tile_rows: int | None = None,
    ):
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
        require(gemm_rows is None or gemm_rows >= 0, f"gemm_rows must be >= 0, got {gemm_rows}")
        require(tile_rows is None or tile_rows >= 0, f"tile_rows must be >= 0, got {tile_rows}")
        self.tile_rows = tile_min_rows(self.dtype) if tile_rows is None else tile_rows
        self.tile_row_ranks = tile_row_ranks(self.dtype) if tile_rows is None else 0
        if gemm_rows is None:  # this CPU's rule; none where the tiles take the runs
            self.gemm_rows = gemm_min_rows(self.dtype, tiles=self.tile_rows > 0)
            self.gemm_row_ranks = gemm_row_ranks(self.dtype) if self.gemm_rows else None
        else:
            self.gemm_rows, self.gemm_row_ranks = gemm_rows or None, None
        # What `slot_rows` checks a slot's rows against.
        d_outs = tuple(b.shape[1] for _, b, _ in self.modules)
        self._fits = (self.d_in, d_outs, self.rank, self.dtype, first.device)
        # slot -> its rows, where they are not the stacks': cut to this group's rank, with
        # the slot's own rank (a prefill asks for both per slot in each group of each layer).
        self.placed: dict[int, SlotRows] = {}
        self.table = self._native_table()

    def place(self, slot: int, rows: Sequence | SlotRows | None) -> None:
        """Read ``slot``'s rows from ``rows`` from now on: per module, A ``[r, d_in]`` and B
        transposed ``[r, d_out]`` (contiguous rows, this group's dtype and device), or None
        where the slot adds nothing to that module; or `SlotRows` checked ahead for a group
        of these shapes (`slot_rows`), which are only pointed at. ``rows=None`` goes back
        to the stacks. The tensors are held until the slot is placed again."""
        require(
            0 <= slot < self.num_slots,
            lambda: f"slot {slot} out of range [0, {self.num_slots})",
        )
        if rows is None:
            self.placed.pop(slot, None)
        else:
            if isinstance(rows, SlotRows):
                require(
                    rows.fits == self._fits,
                    lambda: f"slot rows checked for {rows.fits}, not this group's {self._fits}",
                )
            else:
                rows = _checked(tuple(rows), *self._fits, whole_rows=self.table is not None)
            self.placed[slot] = rows
        if self.table is not None:
            self._point(slot)

    def rows_of(self, slot: int) -> tuple:
        """Per module, the (A ``[r, d_in]``, B transposed ``[r, d_out]``) that ``slot``
        reads, cut to this group's rank, or None where it adds nothing."""
        rows = self.placed.get(slot)
        if rows is None:
            return tuple((a[slot], b[slot].T) for a, b, _ in self.modules)
        return rows.cut

    def own_rank(self, slot: int) -> int:
        """The most rank rows any module of ``slot`` reads (0: it adds nothing here)."""
        rows = self.placed.get(slot)
        return self.rank if rows is None else rows.own_rank

    def _native_table(self):
        """The modules as lora_cpu.c's lora_module array, where the native kernels take
        their tensors (CPU, float32 or bfloat16, contiguous rows); None otherwise. Each
        module points at arrays of one pointer and one rank per slot (`_point` fills them)."""
        stacks = [(a, b.transpose(1, 2)) for a, b, _ in self.modules]
        if not NativeLoRA.fits(*(t for pair in stacks for t in pair)):
            return None
        table = (ModuleStruct * len(stacks))()
        self._slot_arrays = []
        for entry, (a, bt), (_, _, columns) in zip(table, stacks, self.modules, strict=True):
            arrays = (
                (ctypes.c_void_p * self.num_slots)(),
                (ctypes.c_void_p * self.num_slots)(),
                (ctypes.c_int64 * self.num_slots)(),
            )
            self._slot_arrays.append(arrays)
            entry.a, entry.bt, entry.ranks = (ctypes.addressof(array) for array in arrays)
            entry.a_row, entry.b_row = a.stride(1), bt.stride(1)
            entry.d_out, entry.column = bt.shape[2], columns.start
            # Every slot reads the stacks until placed: its rows at a fixed stride (filled
            # as whole arrays; a CPU engine may have thousands of slots).
            slots = range(self.num_slots)
            arrays[0][:] = [a.data_ptr() + s * a.stride(0) * a.element_size() for s in slots]
            arrays[1][:] = [bt.data_ptr() + s * bt.stride(0) * bt.element_size() for s in slots]
            arrays[2][:] = [self.rank] * self.num_slots
        for slot in self.placed:
            self._point(slot)
        return table

    def _point(self, slot: int) -> None:
        """Write ``slot``'s pointers and ranks into the native table."""
        rows = self.placed.get(slot)
        if rows is None:  # the stacks' rows
            for (a_at, bt_at, ranks), (a, b, _) in zip(
                self._slot_arrays, self.modules, strict=True
            ):
                a_at[slot], bt_at[slot], ranks[slot] = (
                    a[slot].data_ptr(),
                    b[slot].data_ptr(),
                    self.rank,
                )
            return
        for (a_at, bt_at, ranks), pointers in zip(self._slot_arrays, rows.pointers, strict=True):
            a_at[slot], bt_at[slot], ranks[slot] = pointers


def lora_apply_modules(
    x: torch.Tensor,
    modules: LoRAModules,
    slot_ids: torch.Tensor,
    scales: torch.Tensor,
    out: torch.Tensor,
    backend: str | None = None,
    index: LoraIndex | None = None,
) -> int:
    """For every module: out[t, columns] += scales[s] * (x[t] @ a[s]^T) @ b[s]^T, s the
    token's slot (rows with -1 untouched). x ``[T, d_in]``, out ``[T, width]`` in place.
    Returns how many rows went through tiles (bf16 runs, lora_tiles.h), 0 on other paths."""
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
        return 0
    if modules.table is not None and x.dtype == modules.dtype:
        if modules.placed or not _use_triton(backend, x, index):
            splits = modules.gemm_rows is not None or modules.tile_rows > 0
            native = _native(index, x, out, splits_long_runs=splits)
            if native is not None:
                return _apply_native(native, x, modules, index, slot_ids, scales, out)
    if modules.placed:
        _apply_per_slot(x, modules, index, scales, out)
        return 0
    for a, b, columns in modules.modules:
        lora_apply(x, a, b, slot_ids, scales, out[:, columns], backend=backend, index=index)
    return 0


def _apply_native(native, x, modules: LoRAModules, index: LoraIndex, slot_ids, scales, out):
    """The native kernel over the batch, but for runs of one slot long enough that a product
    beats its per-token loop (lora_segment_gemm.py): those go through torch's products, or
    through the native call's own tiles (bf16 with AMX). Returns the rows the tiles took."""
    min_rows = modules.gemm_rows
    split = None if min_rows is None else long_segments(index, min_rows)
    if split is not None and modules.gemm_row_ranks is not None:
        split = worth_a_product(index, split, modules.gemm_row_ranks, modules.own_rank)
    if split is not None:
        columns = tuple(cols for _, _, cols in modules.modules)
        apply_long_segments(x, split.runs, modules.rows_of, columns, scales, out)
        if not split.native_rows:
            return 0
        slot_ids = split.native_slot_ids
    tile_rows = modules.tile_rows if native.tiles != TILES_REFUSED else 0
    return native.apply_modules(
        x,
        modules.table,
        len(modules.modules),
        modules.rank,
        scales,
        out,
        slot_ids,
        tile_rows,
        modules.tile_row_ranks,
    )


def _apply_per_slot(
    x: torch.Tensor, modules: LoRAModules, index: LoraIndex, scales: torch.Tensor, out
) -> None:
    """The grouped path where some slot's rows are not the stacks': each slot's tokens as one
    matmul per module, with the rows that slot reads (prefill-sized batches)."""
    ends = index.group_ends.tolist()
    scale_of = scales.tolist()
    for slot in range(index.first_slot, index.last_slot + 1):
        begin, end = (ends[slot - 1] if slot else 0), ends[slot]
        if end == begin:
            continue
        rows = None if index.is_sorted else index.order[begin:end]
        xs = x[begin:end] if rows is None else x.index_select(0, rows)
        for (_, _, columns), weights in zip(modules.modules, modules.rows_of(slot), strict=True):
            if weights is None:
                continue
            a, bt = weights
            delta = ((xs.to(a.dtype) @ a.T) @ bt) * scale_of[slot]
            if rows is None:
                out[begin:end, columns] += delta.to(out.dtype)
            else:
                out[:, columns].index_add_(0, rows, delta.to(out.dtype))
