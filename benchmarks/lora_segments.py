"""The join step's LoRA: one adapter's prompt chunk beside decoding rows of many adapters,
through the native per-token kernel alone against the split (kernels/lora_segment_gemm.py:
the chunk's rows as torch products, the rest native) and, in bf16, against the native call's
tiles (kernels/lora_tiles.h: AMX where the CPU has it, else emulated and slow), on the
default model's projection shapes (SmolLM2-135M: d 576, q/k/v 576+192+192, o 576, gate/up
2x1536, down 1536 -> 576; one layer's seven projections).

    python benchmarks/lora_segments.py --dtype bfloat16 --chunks 16,32,64,128,512,2032
    python benchmarks/lora_segments.py --dtype float32 --ranks 8,64,128
    python benchmarks/lora_segments.py --dtype bfloat16 --tiles

The paths run on the same weights (one group per path: `LoRAModules(gemm_rows=...,
tile_rows=...)`) in turns inside one loop (A, B, A, B...), so a load change hits them all;
the median of each is printed with the CPU's model name and flags of interest. A chunk and
its decoding rows stay within lora_torch.NATIVE_MAX_TOKENS (2048), past which neither path
is the native one.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from harness import machine_line

from loragate import kernels

SHAPES = {
    "qkv": (576, (576, 192, 192)),
    "o": (576, (576,)),
    "gate_up": (576, (1536, 1536)),
    "down": (1536, (576,)),
}


def weights(d_in: int, d_outs: tuple, slots: int, rank: int, dtype) -> list:
    """A projection's modules: per module, A, B and its columns of the fused output."""
    made, start = [], 0
    for d_out in d_outs:
        a = torch.randn(slots, rank, d_in, dtype=dtype) * 0.02
        bt = torch.randn(slots, rank, d_out, dtype=dtype) * 0.02
        made.append((a, bt.transpose(1, 2), slice(start, start + d_out)))
        start += d_out
    return made


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--chunks", default="16,32,64,128,256,512,1024,2032")
    p.add_argument("--ranks", default="8,64,128")
    p.add_argument("--decoding", type=int, default=16, help="decode rows, one adapter each")
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--tiles", action="store_true", help="time the tiles too (bf16)")
    args = p.parse_args()
    dtype = getattr(torch, args.dtype)
    print(machine_line() + f"; dtype {args.dtype}")
    names = ["native", "split", *(["tiles"] if args.tiles else [])]
    print(f"| rank | chunk rows | {' | '.join(f'{n} ms' for n in names)} | ", end="")
    print(" | ".join(f"{n} / native" for n in names[1:]), "|")
    print("|---" * (2 + 2 * len(names) - 1) + "|")
    slots = args.decoding + 1
    for rank in (int(r) for r in args.ranks.split(",")):
        made = {name: weights(d, outs, slots, rank, dtype) for name, (d, outs) in SHAPES.items()}
        for chunk in (int(c) for c in args.chunks.split(",")):
            rules = {"native": (0, 0), "split": (chunk, 0), "tiles": (0, 16)}
            paths = {
                path: {
                    n: kernels.LoRAModules(m, gemm_rows=rules[path][0], tile_rows=rules[path][1])
                    for n, m in made.items()
                }
                for path in names
            }
            ids = torch.tensor([0] * chunk + list(range(1, slots)))
            xs = {n: torch.randn(ids.shape[0], d, dtype=dtype) for n, (d, _) in SHAPES.items()}
            outs = {
                n: torch.zeros(ids.shape[0], sum(o), dtype=dtype) for n, (_, o) in SHAPES.items()
            }
            scales = torch.ones(slots)
            times = {path: [] for path in paths}
            for _ in range(args.repeats):
                for path, groups in paths.items():
                    index = kernels.lora_index(ids, slots)
                    start = time.perf_counter()
                    for name, g in groups.items():
                        kernels.lora_apply_modules(
                            xs[name], g, ids, scales, outs[name], index=index
                        )
                    times[path].append(time.perf_counter() - start)
            ms = [statistics.median(t) * 1e3 for t in times.values()]
            print(f"| {rank} | {chunk} | " + " | ".join(f"{m:.3f}" for m in ms), end=" | ")
            print(" | ".join(f"{m / ms[0]:.2f}" for m in ms[1:]), "|")


if __name__ == "__main__":
    main()
