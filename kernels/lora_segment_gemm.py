"""Long runs of one adapter's rows as matrix products: a prefill chunk's LoRA on tiles.

The native kernels (lora_cpu.c) walk the batch token by token, which is what a decode batch
over many adapters wants and what a prompt does not: a 512-token chunk of one adapter's
prompt, admitted beside the running streams (the join step), is a [512, d_in] by [d_in, r]
product that oneDNN (bf16) or the BLAS (float32) runs many times faster than per-token dot
products. So each run of at least `min_rows` consecutive rows of one slot goes through
`torch.mm`/`addmm_`, and the native kernel takes the rest with those rows masked out (slot
-1). Each slot reads its own rows at its own rank (`LoRAModules.rows_of`), as the native
kernel does.

The threshold depends on the dtype and the CPU, read from its flags at run time
(kernels/cpu_isa.py), and is overridable with LORAGATE_LORA_GEMM_ROWS (rows, for float32 and
bf16 alike; 0 turns the split off). bf16 with AMX: a run's rows times its slot's own rank
at least AMX_ROW_RANKS (and at least AMX_MIN_ROWS rows), as oneDNN's cost there is mostly per
product while the native loop's grows with rows and rank; 1024 rows on AVX512-BF16 without
AMX; never on a CPU with neither (bf16 emulated there). float32 on a CPU with AVX2 and FMA
but no AVX-512: rows times rank at least FLOAT32_AVX2_ROW_RANKS (and at least
FLOAT32_AVX2_MIN_ROWS rows), measured there; never elsewhere (on AVX-512, products won only
from about as many rows times rank, measured against the loop before its run tiles, and a
step's chunks rarely reach that). LoRAModules reads the threshold once, when a projection's
group is prepared.

The split's results differ from the native kernel's by the order of the sums only: in float32
within float32 rounding (a float64 reference bounds both), in bf16 within the bf16 rule (the
rank-r intermediate is rounded to bf16, as PEFT's own bf16 forward rounds it).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from ._backend import require
from .cpu_isa import AVX512_BF16_FLAG, avx2_without_avx512, has_amx, this_cpu_flags
from .lora_groups import LoraIndex

GEMM_ROWS_ENV = "LORAGATE_LORA_GEMM_ROWS"
# Rows of one slot from which a bf16 product beats the native per-token loop. AMX: where rows
# times the slot's rank reach AMX_ROW_RANKS, never under two tiles' worth of rows; measured by
# benchmarks/lora_segments.py on a 2-core Intel Xeon with AMX (2026-11-27, quiet, a chunk of
# one slot beside 16 decoding rows, the default model's seven projections), split against
# native: rank 8 2.7 at 128 rows, 1.14 at 512, 0.76 at 768, 0.71 at 1024; rank 16 1.12 at
# 256, 0.89 at 384, 0.75 at 512; rank 32 1.13 at 192, 0.91 at 256; rank 64 1.21 at 64, 0.92
# at 128, 0.74 at 256; rank 128 0.87 at 96, 0.75 at 128 (BENCHMARKS.md, issue 47): break-even
# near 5,000-8,000 rows x rank. AVX512-BF16 without AMX: the
# native loop (vdpbf16ps) wins short runs and oneDNN's bf16 GEMM long ones; measured by
# benchmarks/lora_segments.py on a 2-core AMD EPYC (2026-11-27, quiet, a chunk of one slot
# beside 16 decoding rows, the default model's q/k/v, gate/up and down, ranks 8-128), split
# against native: 1.19-1.95x at 256 rows, 0.98-1.42x at 512, 0.87-0.96x at 768, 0.79-0.93x at
# 1024 and 0.59-0.74x at 2000 (BENCHMARKS.md, issue 47). A batch of over 2048 tokens takes
# neither (lora_torch.NATIVE_MAX_TOKENS).
AMX_MIN_ROWS = 32
AMX_ROW_RANKS = 8192
AVX512_BF16_MIN_ROWS = 1024
# Rows times a slot's own rank from which a float32 product (the BLAS's sgemm) beats the
# native loop on a CPU with AVX2 and FMA but no AVX-512, and the fewest rows it takes:
# measured by benchmarks/lora_segments.py on a 2-core AMD EPYC of that kind (2026-11-28,
# load 0.5-0.9, a chunk beside 8 decoding rows of other slots, the default model's seven
# projections), split against the native loop with its run tiles: rank 8 2.36 at 150 rows,
# 1.97 at 256, 1.42 at 1024, 1.23 at 2032 (never); rank 32 1.27 at 256, 0.87 at 1024; rank 64
# 1.24 at 150, 1.18 at 256, 1.01 at 384, 0.95 at 512, 0.82 at 1024, 0.74 at 2032; rank 128
# 1.06 at 192, 1.03 at 256, 0.89 at 384, 0.76 at 1024: break-even near 24,000-37,000 rows x
# rank. (Against the loop before its run tiles, 2026-11-27, rows alone decided, from 256.)
FLOAT32_AVX2_MIN_ROWS = 256
FLOAT32_AVX2_ROW_RANKS = 32768
# Where the CPU has AMX, a bf16 run of one slot goes to tiles inside the native call
# (lora_tiles.h) from AMX_TILE_ROWS rows, where its rows times the slot's own rank reach
# AMX_TILE_ROW_RANKS; the tiles then take the runs that products took (no products on AMX).
# Measured by benchmarks/lora_segments.py --tiles on a 2-core Intel Xeon with AMX
# (2026-11-28 21:30 UTC, load 1.4-1.7, a chunk of one slot beside 16 decoding rows of other
# slots, the default model's seven projections, since the loops' rows are shared between the
# threads by the weights they read), tiles against the loops, two runs: rank 8 1.06-1.08 at
# 16 rows, 0.82-1.06 at 24-32, 0.92-0.95 at 48, 0.81 at 64, 0.67 at 128-256; rank 16 1.00-1.08
# at 16, 0.87-0.90 at 24, 0.83-0.92 at 32, 0.72-0.81 at 48, 0.52 at 256; rank 32 0.96 at 16,
# 0.81-0.83 at 24-32, 0.45 at 256; rank 64 0.96-1.01 at 16, 0.86-0.87 at 24, 0.82-0.88 at 32,
# 0.45 at 256; rank 128 1.00 at 16, 0.78 at 24, 0.46 at 256: from 24 rows at rank 16 and up,
# from 48 at rank 8 (384 rows x rank). (Before that sharing, the same CPU kind on the same
# day: rank 8 1.24 at 64 rows, ranks 64-128 1.00-1.02 at 48: from 64 rows and 2,048 rows x
# rank.) Against the products 0.35-0.83 at every length measured (BENCHMARKS.md, issue 47).
# LORAGATE_LORA_TILE_ROWS sets the rows alone (0: off), and on a CPU without AMX turns on
# the tiles' emulation (for tests: slow).
TILE_ROWS_ENV = "LORAGATE_LORA_TILE_ROWS"
AMX_TILE_ROWS = 24
AMX_TILE_ROW_RANKS = 384


@dataclass(frozen=True)
class LongSegments:
    """A sorted batch's slots with runs of at least min_rows rows, and the slot ids the
    native kernel takes for the rest (those runs' rows set to -1)."""

    runs: tuple[tuple[int, int, int], ...]  # (slot, first row, end row)
    native_slot_ids: torch.Tensor
    native_rows: int  # rows left with a slot for the native kernel


def gemm_min_rows(
    dtype: torch.dtype, flags: frozenset[str] | None = None, tiles: bool = False
) -> int | None:
    """From how many rows of one slot a product runs instead of the per-token loop, for
    tensors of `dtype` on this CPU (or one with `flags`); None: never, and where `tiles`
    take the runs (unless LORAGATE_LORA_GEMM_ROWS says otherwise). Reads the environment
    and the CPU's flags: call it once, where a projection's group is prepared (LoRAModules),
    not per call."""
    if dtype not in (torch.bfloat16, torch.float32):
        return None  # the native kernel takes no other dtype
    override = os.environ.get(GEMM_ROWS_ENV, "").strip()
    if override:
        require(
            override.isdigit(),
            lambda: f"{GEMM_ROWS_ENV} must be a whole number of rows (0: off), got {override!r}",
        )
        return int(override) or None
    if tiles:
        return None
    flags = this_cpu_flags() if flags is None else flags
    if dtype == torch.float32:
        return FLOAT32_AVX2_MIN_ROWS if avx2_without_avx512(flags) else None
    if has_amx(flags):
        return AMX_MIN_ROWS
    return AVX512_BF16_MIN_ROWS if AVX512_BF16_FLAG in flags else None


def tile_min_rows(dtype: torch.dtype, flags: frozenset[str] | None = None) -> int:
    """From how many rows of one slot a run of `dtype` goes to the native call's tiles
    (lora_tiles.h: bf16 only) on this CPU (or one with `flags`); 0: never. Read once,
    where a group is prepared."""
    if dtype != torch.bfloat16:
        return 0
    override = os.environ.get(TILE_ROWS_ENV, "").strip()
    if override:
        require(
            override.isdigit(),
            lambda: f"{TILE_ROWS_ENV} must be a whole number of rows (0: off), got {override!r}",
        )
        return int(override)
    return AMX_TILE_ROWS if has_amx(this_cpu_flags() if flags is None else flags) else 0


def tile_row_ranks(dtype: torch.dtype, flags: frozenset[str] | None = None) -> int:
    """Rows times a slot's own rank from which its run goes to the tiles, on top of
    `tile_min_rows` (0: rows alone decide, as where LORAGATE_LORA_TILE_ROWS sets them)."""
    if dtype != torch.bfloat16 or os.environ.get(TILE_ROWS_ENV, "").strip():
        return 0
    return AMX_TILE_ROW_RANKS if has_amx(this_cpu_flags() if flags is None else flags) else 0


def gemm_row_ranks(dtype: torch.dtype, flags: frozenset[str] | None = None) -> int | None:
    """Rows times a slot's own rank from which its run takes a product, on top of
    `gemm_min_rows` (None: rows alone decide): AMX_ROW_RANKS for bf16 on a CPU with AMX,
    FLOAT32_AVX2_ROW_RANKS for float32 on one with AVX2 but no AVX-512, unless
    LORAGATE_LORA_GEMM_ROWS sets the rows. Read once, where a group is prepared."""
    if os.environ.get(GEMM_ROWS_ENV, "").strip():
        return None
    flags = this_cpu_flags() if flags is None else flags
    if dtype == torch.bfloat16:
        return AMX_ROW_RANKS if has_amx(flags) else None
    if dtype == torch.float32:
        return FLOAT32_AVX2_ROW_RANKS if avx2_without_avx512(flags) else None
    return None


def worth_a_product(
    index: LoraIndex, split: LongSegments, row_ranks: int, rank_of
) -> LongSegments | None:
    """`split`'s runs whose rows times their slot's own rank (`rank_of(slot)`) reach
    `row_ranks`; the others go back to the native kernel. Worked out once per index and set
    of runs kept."""
    kept = tuple(run for run in split.runs if (run[2] - run[1]) * rank_of(run[0]) >= row_ranks)
    if kept == split.runs:
        return split
    if not kept:
        return None
    key = ("long_segments", kept)
    if key not in index.derived:
        index.derived[key] = _segments(index, kept)
    return index.derived[key]


def long_segments(index: LoraIndex, min_rows: int) -> LongSegments | None:
    """The batch's runs of at least `min_rows` consecutive rows of one slot (a prompt chunk
    is one: its rows lie together whatever the order around them, prefills before decodes),
    or None when it has none. Worked out once per index and threshold, not in each of a
    step's LoRA calls."""
    if index.num_active < min_rows or index.static:
        return None
    key = ("long_segments", min_rows)
    if key in index.derived:
        return index.derived[key]
    ids = index.slot_ids
    starts = [0, *(torch.nonzero(ids[1:] != ids[:-1]).flatten() + 1).tolist(), ids.shape[0]]
    slot_at = ids[torch.tensor(starts[:-1])].tolist()
    runs = tuple(
        (slot, first, end)
        for slot, first, end in zip(slot_at, starts[:-1], starts[1:], strict=True)
        if slot >= 0 and end - first >= min_rows
    )
    found = _segments(index, runs) if runs else None
    index.derived[key] = found
    return found


def _segments(index: LoraIndex, runs: tuple[tuple[int, int, int], ...]) -> LongSegments:
    """`runs` for the products, and the batch's slot ids with their rows set to -1 for the
    native kernel."""
    native = index.slot_ids.clone()
    for _, first, end in runs:
        native[first:end] = -1
    covered = sum(end - first for _, first, end in runs)
    return LongSegments(runs, native, index.num_active - covered)


def apply_long_segments(
    x: torch.Tensor,
    runs: tuple[tuple[int, int, int], ...],
    rows_of,
    columns: tuple[slice, ...],
    scales: torch.Tensor,
    out: torch.Tensor,
) -> None:
    """out[first:end, module's columns] += scale[s] * (x[first:end] @ A^T) @ Bt for each run
    and module; `rows_of(slot)` gives per module (A [r, d_in], Bt [r, d_out]) or None."""
    for slot, first, end in runs:
        scale = float(scales[slot])  # only the runs' slots: there may be a thousand
        xs = x[first:end]
        for cols, weights in zip(columns, rows_of(slot), strict=True):
            if weights is None:
                continue
            a, bt = weights
            out[first:end, cols].addmm_(xs @ a.T, bt, alpha=scale)
