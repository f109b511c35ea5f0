"""The native LoRA kernel of a git revision against the working tree's, alternating (A/B).

Both builds of kernels/lora_cpu.c (the revision's source and headers taken with `git show`)
are loaded side by side and called in turns, round by round, so a loaded machine slows both
alike: one layer of SmolLM2-135M's LoRA as the engine calls it, `lora_apply_modules` once
per projection (q/k/v, o, gate/up, down; each module into its own columns), over `--slots`
adapters, every slot holding its own weights, the rows sorted by slot, at decode and
prefill token counts, in float32 and bfloat16, at each of `--ranks`. Prints microseconds per
layer (median) and the largest difference between the two outputs, relative to the
output's largest value (float32 must be 0: bit-equal).

    .venv/bin/python benchmarks/lora_kernel_ab.py --old-rev e04848a
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch

from loragate.kernels import LoRAModules, _native
from loragate.kernels.lora_cpu import TILES_REFUSED, NativeLoRA

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("kernels/lora_cpu.c", "kernels/cpu_simd.h", "kernels/lora_tiles.h")
PROJECTIONS = {  # d_in, the modules' d_out
    "qkv": (576, (576, 192, 192)),
    "o": (576, (576,)),
    "gate_up": (576, (1536, 1536)),
    "down": (1536, (576,)),
}


def build_revision(rev: str, into: Path) -> NativeLoRA:
    for source in SOURCES:
        shown = subprocess.run(
            ["git", "-C", str(ROOT), "show", f"{rev}:{source}"], capture_output=True
        )
        if shown.returncode == 0:  # a revision from before a header has none
            (into / Path(source).name).write_bytes(shown.stdout)
    library = ctypes.CDLL(str(_native.build(into / "lora_cpu.c")))
    if not hasattr(library, "lora_tiles_ready"):  # from before the tiles: none to ask for
        library.lora_tiles_ready = lambda: TILES_REFUSED
    return NativeLoRA(library)


def layer(dtype: torch.dtype, slots: int, rank: int) -> dict[str, LoRAModules]:
    """Per projection, its modules: A [S, r, d_in], B [S, d_out, r] and output columns."""
    groups = {}
    for name, (d_in, d_outs) in PROJECTIONS.items():
        modules, start = [], 0
        for d_out in d_outs:
            a = torch.randn(slots, rank, d_in, dtype=dtype) * 0.1
            bt = torch.randn(slots, rank, d_out, dtype=dtype) * 0.1  # B's rows contiguous
            modules.append((a, bt.transpose(1, 2), slice(start, start + d_out)))
            start += d_out
        groups[name] = LoRAModules(modules, gemm_rows=0)
        assert groups[name].table is not None, "the native kernel's table"
    return groups


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--old-rev", required=True, help="the git revision to compare with")
    ap.add_argument("--slots", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--ranks", default="8,16,64")
    ap.add_argument("--tokens", default="1,8,16,64,600", help="rows a call, sorted by slot")
    args = ap.parse_args()
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        builds = {
            args.old_rev: build_revision(args.old_rev, Path(tmp)),
            "working tree": NativeLoRA(
                ctypes.CDLL(str(_native.build(ROOT / "kernels" / "lora_cpu.c")))
            ),
        }
        print(f"| dtype | rank | tokens | {args.old_rev} us | working tree us | speedup | diff |")
        print("|---|---|---|---|---|---|---|")
        for dtype in (torch.float32, torch.bfloat16):
            for rank in (int(r) for r in args.ranks.split(",")):
                groups = layer(dtype, args.slots, rank)
                for tokens in (int(t) for t in args.tokens.split(",")):
                    slots = (torch.arange(tokens) * args.slots // tokens).contiguous()
                    xs = {
                        n: torch.randn(tokens, d, dtype=dtype) for n, (d, _) in PROJECTIONS.items()
                    }
                    scales = torch.rand(args.slots) + 0.5
                    times: dict[str, list[float]] = {name: [] for name in builds}
                    outs = {}
                    for _ in range(args.rounds):
                        for name, build in builds.items():
                            out = {
                                n: torch.zeros(tokens, g.width, dtype=dtype)
                                for n, g in groups.items()
                            }
                            began = time.perf_counter()
                            for n, g in groups.items():
                                build.apply_modules(
                                    xs[n], g.table, len(g.modules), g.rank, scales, out[n], slots
                                )
                            times[name].append((time.perf_counter() - began) * 1e6)
                            outs[name] = torch.cat([o.double() for o in out.values()], dim=1)
                    old, new = (statistics.median(t) for t in times.values())
                    a, b = outs.values()
                    diff = ((a - b).abs().max() / a.abs().max()).item()
                    print(
                        f"| {str(dtype).split('.')[1]} | {rank} | {tokens} | {old:.1f} | "
                        f"{new:.1f} | {old / new:.2f}x | {diff:.1e} |"
                    )


if __name__ == "__main__":
    main()
