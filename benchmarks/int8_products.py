"""One decode-sized product per GGUF block format, float32 activations against int8 ones.

Each format's weight (random blocks, float16 scales set to a plain value) of
``--out`` x ``--in`` weights times ``--rows`` activation rows, on every path this CPU runs:
the float32 kernels' (kernels/quant_cpu.py: 8-lane AVX2, 16-lane AVX-512) and the int8
mode's (kernels/quant_int8.py: AVX2, AVX512-VNNI), the int8 time including the rows'
quantization. Paths take turns round by round (best of ``--rounds``), so a load change hits
all alike. Reported: ms per product, the weight's GB/s, and the best int8 path against the
best float32 path. Name the CPU and load with the figures (printed first).

    .venv/bin/python benchmarks/int8_products.py                 # one thread
    .venv/bin/python benchmarks/int8_products.py --threads 2 --out 14336
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from harness import machine_line, print_table

from loragate.kernels.quant_blocks import QuantizedWeight, block_format
from loragate.kernels.quant_cpu import AVX512, VECTOR, cpu_paths, native_quant
from loragate.kernels.quant_int8 import AVX2, FORMATS, VNNI, int8_paths, native_int8

# Where each format's float16 scales sit in its block (d, and dmin for Q4_K/Q5_K).
HALVES = {"Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,)}
HALVES |= {"Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}
FLOAT_PATHS = {VECTOR: "float32 AVX2", AVX512: "float32 AVX-512"}
INT8_PATHS = {AVX2: "int8 AVX2", VNNI: "int8 AVX512-VNNI"}


def weight(name: str, out_features: int, in_features: int) -> QuantizedWeight:
    fmt = block_format(name)
    count = out_features * in_features // fmt.block_size
    blocks = np.random.default_rng(0).integers(0, 256, (count, fmt.block_bytes), dtype=np.uint8)
    for at in HALVES[name]:
        blocks[:, at : at + 2] = np.full((count, 1), 0.01, np.float16).view(np.uint8)
    return QuantizedWeight.of(torch.from_numpy(blocks.reshape(out_features, -1)), name, in_features)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=int, default=4096)
    ap.add_argument("--in", dest="inputs", type=int, default=4096)
    ap.add_argument("--rows", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--formats", default=",".join(sorted(FORMATS)))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(machine_line())
    print(f"# [{args.rows}, {args.inputs}] x [{args.out}, {args.inputs}]^T; best of {args.rounds}")
    floats, int8 = native_quant(), native_int8()
    x = torch.randn(args.rows, args.inputs, generator=torch.Generator().manual_seed(1))
    out = torch.empty(args.rows, args.out)
    runs = {
        **{name: p for p, name in FLOAT_PATHS.items() if p in cpu_paths()},
        **{name: p for p, name in INT8_PATHS.items() if p in int8_paths()},
    }

    def call(arm: str, path: int, w: QuantizedWeight) -> None:
        if arm.startswith("int8"):
            int8.linear_rows(x, w, None, out, path)
        else:
            floats.linear(x, w, None, out, path)

    rows = []
    for name in args.formats.split(","):
        w = weight(name, args.out, args.inputs)
        best = dict.fromkeys(runs, float("inf"))
        for _ in range(args.rounds):
            for arm, path in runs.items():
                call(arm, path, w)  # warm
                start = time.perf_counter()
                for _ in range(5):
                    call(arm, path, w)
                best[arm] = min(best[arm], (time.perf_counter() - start) / 5)
        gb = w.blocks.numel() / 1e9
        fastest_float = min(t for arm, t in best.items() if arm.startswith("float32"))
        fastest_int8 = min(t for arm, t in best.items() if arm.startswith("int8"))
        cells = [f"{best[arm] * 1e3:.3f} ms ({gb / best[arm]:.1f} GB/s)" for arm in runs]
        rows.append([name, *cells, f"{fastest_float / fastest_int8:.2f}x"])
    print_table(["format", *runs, "best int8 / best float32"], rows)


if __name__ == "__main__":
    main()
