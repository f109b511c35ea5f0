"""The int8-activation mode of block-format products (kernels/quant_int8.py), against a
float64 reference over the same integers: activations quantized per 32 values exactly as
specified (scale max|x| / 127, values rounded to nearest, ties to even, in float32), and the
product of those int8 rows with the weight's float32 values. Odd shapes: one row, rows not a
multiple of the kernel's four or of a tile's 16, outputs not a multiple of anything. Every
path this CPU runs, and the AMX-INT8 tiles' emulation on any CPU (the same packing, tiling
and scaling code as on AMX; the K-quants, which the tiles do not take, are refused there).
And against the default float32 path: they differ by no more than the activations'
rounding allows."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
from dataclasses import replace

import numpy as np
import pytest
import torch
from quant_testlib import random_weight

from loragate.kernels import _native, quant_int8
from loragate.kernels.cpu_isa import has_amx_int8, this_cpu_flags
from loragate.kernels.lora_cpu import TILES_EMULATED, TILES_NATIVE, TILES_REFUSED
from loragate.kernels.quant_dequant import dequantize
from loragate.kernels.quant_int8 import (
    AMX_INT8,
    AMX_ROWS,
    AVX2,
    FORMATS,
    K_FORMATS,
    PORTABLE,
    TILE_FORMATS,
    VNNI,
    NativeInt8,
    int8_path,
    int8_paths,
    native_int8,
    takes_all_rows,
    takes_int8,
)
from loragate.kernels.quant_linear import quantized_linear

# (rows, outputs, inputs): one row, rows short of the loops' 4 and of a tile's 16, a tile and
# one row, four tiles; outputs never a multiple of 16; inputs of 2 to 10 blocks (the SIMD
# loops take eight at a time: fewer, exactly eight, and eight and two).
SHAPES = [(1, 37, 96), (5, 40, 256), (12, 3, 64), (17, 50, 128), (64, 23, 160), (3, 29, 320)]
EMULATED_TILES = "emulated tiles"


@pytest.fixture(scope="module")
def kernels():
    built = native_int8()
    assert built is not None, "quant_int8_cpu.c did not build"
    expected = TILES_NATIVE if has_amx_int8(this_cpu_flags()) else TILES_EMULATED
    assert built.tiles == expected, "AMX where the CPU has it, the emulation elsewhere"
    return built


@pytest.fixture(scope="module")
def emulated():
    """The library built with the tiles' emulation, whatever the CPU (the default build on a
    CPU without AMX is the same)."""
    path = _native.build(quant_int8._library.source, defines=("Q8_TILES_EMULATED",))
    loaded = NativeInt8(ctypes.CDLL(str(path)))
    assert loaded.tiles == TILES_EMULATED
    return loaded


def reference_rows(x: np.ndarray):
    blocks = x.reshape(x.shape[0], -1, 32)
    d = (np.abs(blocks).max(axis=2) / np.float32(127)).astype(np.float32)
    safe = np.where(d == 0, np.float32(1), d)
    q = np.where(d[..., None] == 0, 0, np.rint(blocks / safe[..., None])).astype(np.int8)
    return q.reshape(x.shape), d, q.astype(np.int32).sum(axis=2)


@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("path", [*int8_paths(), EMULATED_TILES])
@pytest.mark.parametrize("name", sorted(FORMATS))
@pytest.mark.parametrize("m,n,k", SHAPES)
def test_int8_rows_times_blocks_equal_the_float64_reference(
    kernels, emulated, name, m, n, k, path, with_bias
):
    if name in K_FORMATS:
        k = 256 * max(1, k // 64)  # whole super-blocks: one to four
    weight = random_weight(name, n, k, seed=m + n)
    assert takes_int8(weight)
    gen = torch.Generator().manual_seed(k + m)
    x = torch.randn(m, k, generator=gen)
    x[0, :32] = 0.0  # a block of zeros: scale 0, values 0
    bias = torch.randn(n, generator=gen) if with_bias else None
    rows = kernels.quantize_rows(x)
    q, d, s = reference_rows(x.numpy())
    assert np.array_equal(rows.q.numpy(), q)
    assert np.array_equal(rows.d.numpy(), d)
    assert np.array_equal(rows.s.numpy(), s)
    out = torch.full((m, n), float("nan"))  # an output left unwritten shows
    if path == EMULATED_TILES and name in K_FORMATS:
        with pytest.raises(ValueError, match="refused"):
            emulated.linear(rows, weight, bias, out, AMX_INT8)
        return
    if path == EMULATED_TILES:
        emulated.linear(rows, weight, bias, out, AMX_INT8)
    else:
        kernels.linear(rows, weight, bias, out, path)
    w64 = dequantize(weight).double().numpy()
    x64 = (q.reshape(m, -1, 32) * d[..., None].astype(np.float64)).reshape(m, k)
    b64 = bias.double().numpy() if with_bias else np.zeros(n)
    want = x64 @ w64.T + b64
    bound = np.abs(x64) @ np.abs(w64).T + np.abs(b64)
    assert np.all(np.abs(out.double().numpy() - want) <= 2e-6 * bound + 1e-7)
    # The integer products are exact on every path: the portable loops' outputs up to the
    # float32 rounding of the same scaled sums, taken in the same block order.
    portable = torch.empty(m, n)
    kernels.linear(rows, weight, bias, portable, PORTABLE)
    apart = np.abs(out.double().numpy() - portable.double().numpy())
    assert np.all(apart <= 1e-6 * bound + 1e-9)
    # Against the float32 activations: apart by at most each weight times half its block's
    # activation step (the rounding of x), plus float32's own sums.
    exact = quantized_linear(x, weight, bias)
    step = np.repeat(d, 32, axis=1).astype(np.float64) / 2
    allowed = step @ np.abs(w64).T
    assert np.all(np.abs(out.double().numpy() - exact.double().numpy()) <= allowed + 1e-5 * bound)


@pytest.mark.parametrize("threads", [1, 3])
def test_the_emulated_tiles_share_outputs_between_threads(emulated, threads):
    """Five groups of 16 outputs (the last of 7) over three threads give what one gives,
    bit for bit: each output's sums are one thread's, in the same order."""
    weight = random_weight("Q5_1", 71, 512, seed=4)
    rows = emulated.quantize_rows(torch.randn(40, 512, generator=torch.Generator().manual_seed(1)))
    outs = []
    for count in (1, threads):
        previous = torch.get_num_threads()
        torch.set_num_threads(count)
        try:
            out = torch.empty(40, 71)
            emulated.linear(rows, weight, None, out, AMX_INT8)
        finally:
            torch.set_num_threads(previous)
        outs.append(out)
    assert torch.equal(outs[0], outs[1])


def test_each_simd_path_runs_where_the_cpu_has_it(kernels):
    """Each path this CPU runs is tested above; the paths are chosen from the flags."""
    assert kernels.has_simd_paths  # x86 with GCC: both SIMD paths are built
    vnni = frozenset({"avx2", "fma", "f16c", "avx512f", "avx512vl", "avx512_vnni"})
    assert int8_paths(vnni) == [PORTABLE, AVX2, VNNI]
    assert int8_paths(frozenset({"avx2", "fma", "f16c", "avx512f"})) == [PORTABLE, AVX2]
    assert int8_paths(frozenset({"avx2", "fma"})) == [PORTABLE]


def test_the_tiles_are_chosen_where_the_cpu_has_amx_int8_and_the_state_is_lent(kernels):
    vnni = frozenset({"avx2", "fma", "f16c", "avx512f", "avx512vl", "avx512_vnni"})
    amx = vnni | {"amx_tile", "amx_int8", "amx_bf16"}
    assert int8_paths(amx, tiles=TILES_NATIVE) == [PORTABLE, AVX2, VNNI, AMX_INT8]
    assert int8_paths(amx, tiles=TILES_REFUSED)[-1] == VNNI, "Linux refused the tile state"
    assert int8_paths(amx, tiles=TILES_EMULATED)[-1] == VNNI, "the emulation: tests only"
    assert int8_paths(amx - {"amx_int8"}, tiles=TILES_NATIVE)[-1] == VNNI, "bf16 tiles only"
    assert int8_paths(vnni, tiles=TILES_NATIVE)[-1] == VNNI


def test_the_tiles_take_products_of_a_tile_of_rows_or_more(monkeypatch):
    """On AMX (the paths as there; this library's tiles, emulated here, run them): products
    of 16 rows or more go to the tiles whatever their size, fewer rows to AVX512-VNNI; on a
    CPU without AMX, products of as many rows keep the float32 path."""
    weight = replace(random_weight("Q4_1", 45, 128, seed=6), activations="int8")
    x = torch.randn(AMX_ROWS + 4, 128, generator=torch.Generator().manual_seed(2))
    float32 = quantized_linear(x, replace(weight, activations=None))
    here = quantized_linear(x, weight)
    if not takes_all_rows():
        assert torch.equal(here, float32), "prefill-sized products keep float32 here"
    monkeypatch.setattr(quant_int8, "_paths_here", lambda: (PORTABLE, AVX2, VNNI, AMX_INT8))
    assert int8_path(1) == VNNI and int8_path(AMX_ROWS - 1) == VNNI
    assert int8_path(AMX_ROWS) == AMX_INT8 and takes_all_rows()
    kernels = native_int8()
    rows = kernels.quantize_rows(x)
    tiles = torch.empty(len(x), 45)
    kernels.linear(rows, weight, None, tiles, AMX_INT8)
    assert torch.equal(quantized_linear(x, weight), tiles)


def test_the_amx_build_runs_its_tiles_only_with_the_tile_state(emulated, tmp_path):
    """The library as a compiler targeting AMX-INT8 builds it (the tiles the instructions,
    by -mamx-tile -mamx-int8 on top of this CPU's flags): on a CPU without AMX Linux lends
    no tile state, so the tiles are refused and the path with them; on one with AMX they
    give what the emulation gives."""
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    source = quant_int8._library.source
    built = tmp_path / "quant_int8_amx.so"
    command = [compiler, *_native.FLAGS, "-mamx-tile", "-mamx-int8", str(source), "-o", str(built)]
    result = subprocess.run([*command, "-lm"], capture_output=True, text=True, timeout=120)
    if result.returncode and "amx" in result.stderr:
        pytest.skip(f"{compiler} does not target AMX: {result.stderr.strip()}")
    assert result.returncode == 0, result.stderr
    amx = NativeInt8(ctypes.CDLL(str(built)))
    assert amx.tiles == (TILES_NATIVE if has_amx_int8(this_cpu_flags()) else TILES_REFUSED)
    weight = random_weight("Q8_0", 21, 96, seed=8)
    rows = amx.quantize_rows(torch.randn(18, 96, generator=torch.Generator().manual_seed(3)))
    want = torch.empty(18, 21)
    emulated.linear(rows, weight, None, want, AMX_INT8)
    out = torch.full((18, 21), float("nan"))
    if amx.tiles != TILES_NATIVE:
        with pytest.raises(ValueError, match="refused"):
            amx.linear(rows, weight, None, out, AMX_INT8)
        amx.linear(rows, weight, None, out, PORTABLE)
    else:
        amx.linear(rows, weight, None, out, AMX_INT8)
    assert torch.allclose(out, want, rtol=1e-5, atol=1e-6)


def test_an_unknown_path_is_refused(kernels):
    weight = random_weight("Q4_0", 3, 64)
    rows = kernels.quantize_rows(torch.randn(1, 64))
    with pytest.raises(ValueError, match="refused"):
        kernels.linear(rows, weight, None, torch.empty(1, 3), path=4)


def test_other_formats_are_not_taken():
    assert takes_int8(random_weight("Q4_K", 4, 256))
    assert not takes_int8(random_weight("I8_CH", 4, 64))
    assert not takes_int8(random_weight("I4_G32", 4, 64))


def test_the_tiles_take_no_k_quant(monkeypatch):
    """Where the tiles run, a K-quant's decode-sized products take the best other path and
    its prefill-sized ones keep float32: the tiles pack only 32-weight blocks."""
    weight = replace(random_weight("Q6_K", 9, 512, seed=3), activations="int8")
    monkeypatch.setattr(quant_int8, "_paths_here", lambda: (PORTABLE, AVX2, VNNI, AMX_INT8))
    assert takes_all_rows() and not takes_all_rows(weight)
    assert int8_path(AMX_ROWS, tiles=False) == VNNI
    assert TILE_FORMATS.isdisjoint(K_FORMATS) and FORMATS == TILE_FORMATS | K_FORMATS


@pytest.mark.parametrize("name", ["Q4_1", "Q8_0", "Q4_K", "Q6_K"])
def test_one_call_quantizes_and_multiplies_as_the_two_do(kernels, name):
    """`linear_rows` (the engine's call: the rows quantized into the thread's reused buffer,
    then multiplied, in one native call) gives what quantize_rows then linear give, bit for
    bit, on every path; a strided x (a view of wider rows) included."""
    weight = random_weight(name, 19, 512, seed=5)
    wide = torch.randn(6, 600, generator=torch.Generator().manual_seed(4))
    for x in (wide[:, :512].contiguous(), wide[:, 40:552]):
        for path in int8_paths():
            want, got = torch.empty(6, 19), torch.full((6, 19), float("nan"))
            kernels.linear(kernels.quantize_rows(x.contiguous()), weight, None, want, path)
            kernels.linear_rows(x, weight, None, got, path)
            assert torch.equal(got, want), (name, path)
