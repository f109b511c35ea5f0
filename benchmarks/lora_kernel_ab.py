"""The native LoRA kernel of a git revision against the working tree's, alternating (A/B).

Both builds of kernels/lora_cpu.c (the revision's source and headers taken with `git show`)
are loaded side by side and called in turns, round by round, so a loaded machine slows both
alike: one q/k/v projection's three `lora_apply` calls (the entry point both revisions share;
SmolLM2-135M's widths), each module into its own columns, over
`--slots` adapters, every slot holding its own weights, at decode and prefill token counts,
in float32 and bfloat16, ranks 16 and 64. Prints microseconds per call (median) and the
largest difference between the two outputs of one call, relative to the output's largest
value.

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

from loragate.kernels import _native
from loragate.kernels.lora_cpu import NativeLoRA

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("kernels/lora_cpu.c", "kernels/cpu_simd.h")
D_IN, D_OUTS = 576, (576, 192, 192)


def build_revision(rev: str, into: Path) -> NativeLoRA:
    for source in SOURCES:
        text = subprocess.run(
            ["git", "-C", str(ROOT), "show", f"{rev}:{source}"],
            capture_output=True,
            check=True,
        ).stdout
        (into / Path(source).name).write_bytes(text)
    return NativeLoRA(ctypes.CDLL(str(_native.build(into / "lora_cpu.c"))))


def group(dtype: torch.dtype, slots: int, rank: int) -> list:
    """Per module: A [S, r, d_in], B transposed [S, r, d_out] and its output columns."""
    modules, start = [], 0
    for d_out in D_OUTS:
        a = torch.randn(slots, rank, D_IN, dtype=dtype)
        bt = torch.randn(slots, rank, d_out, dtype=dtype)
        modules.append((a, bt, slice(start, start + d_out)))
        start += d_out
    return modules


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--old-rev", required=True, help="the git revision to compare with")
    ap.add_argument("--slots", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=40)
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
            for rank in (16, 64):
                prepared = group(dtype, args.slots, rank)
                for tokens in (64, 600):
                    slots = (torch.arange(tokens) * args.slots // tokens).contiguous()
                    x = torch.randn(tokens, D_IN, dtype=dtype)
                    scales = torch.rand(args.slots) + 0.5
                    width = sum(D_OUTS)
                    times: dict[str, list[float]] = {name: [] for name in builds}
                    outs = {}
                    for _ in range(args.rounds):
                        for name, build in builds.items():
                            out = torch.zeros(tokens, width, dtype=dtype)
                            began = time.perf_counter()
                            for a, bt, columns in prepared:
                                build.apply(x, a, bt, scales, out[:, columns], slots)
                            times[name].append((time.perf_counter() - began) * 1e6)
                            outs[name] = out.double()
                    old, new = (statistics.median(t) for t in times.values())
                    a, b = outs.values()
                    diff = ((a - b).abs().max() / a.abs().max()).item()
                    print(
                        f"| {str(dtype).split('.')[1]} | {rank} | {tokens} | {old:.1f} | "
                        f"{new:.1f} | {old / new:.2f}x | {diff:.1e} |"
                    )


if __name__ == "__main__":
    main()
