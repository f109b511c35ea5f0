"""Per-op CPU micro-benchmark: each native kernel against the torch code it replaced, in one
process, alternating old and new over several rounds (median), so a loaded machine slows both
alike. Shapes are one decode step of SmolLM2-135M at 64 sequences.

    .venv/bin/python benchmarks/cpu_ops.py                    # float32 and bfloat16
    .venv/bin/python benchmarks/cpu_ops.py --dtype bfloat16 --rounds 30

Prints microseconds per call (old, new) and the speedup; per decode step each op runs once
per layer (30 layers), the LoRA op four times per layer.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from unittest import mock

import torch

from loragate import kernels
from loragate.kernels import decode_attention, lora_torch, norm

HEADS, KV_HEADS, HEAD_DIM, BLOCK, HIDDEN = 9, 3, 64, 16, 576


CLOCK = {"wall": time.perf_counter, "cpu": time.process_time}
clock = time.perf_counter


def timed(fn: Callable[[], object], inner: int) -> float:
    start = clock()
    for _ in range(inner):
        fn()
    return (clock() - start) / inner * 1e6


def compare(name: str, old: Callable, new: Callable, rounds: int, inner: int) -> None:
    old(), new()  # warm up (and build the native libraries)
    olds, news = [], []
    for _ in range(rounds):
        olds.append(timed(old, inner))
        news.append(timed(new, inner))
    o, n = statistics.median(olds), statistics.median(news)
    print(f"| {name} | {o:.0f} | {n:.0f} | {o / n:.2f}x |")


def paged_cache(lens: list[int], dtype):
    blocks = sum(-(-n // BLOCK) for n in lens) + 1
    k = torch.randn(blocks, BLOCK, KV_HEADS, HEAD_DIM).to(dtype)
    v = torch.randn(blocks, BLOCK, KV_HEADS, HEAD_DIM).to(dtype)
    width = max(-(-n // BLOCK) for n in lens)
    perm = torch.randperm(blocks - 1).tolist()
    tables = torch.zeros(len(lens), width, dtype=torch.int32)
    for b, n in enumerate(lens):
        for i in range(-(-n // BLOCK)):
            tables[b, i] = perm.pop()
    return k, v, tables, torch.tensor(lens, dtype=torch.int32)


def old_rope(q, k, cos_sin, positions):
    """What the model ran before apply_rope_: a gather, then torch rotate-half on q and k."""
    cos, sin = cos_sin[positions].chunk(2, dim=-1)
    return kernels.apply_rope(q, cos, sin, "torch"), kernels.apply_rope(k, cos, sin, "torch")


def run(dtype: torch.dtype, rounds: int, batch: int) -> None:
    threads = torch.get_num_threads()
    print(f"\n{dtype}, batch {batch}, {threads} threads; {clock.__name__} us per call\n")
    print("| op | torch (old) | native (new) | speedup |\n|---|---|---|---|")
    torch.manual_seed(0)
    lens = torch.randint(64, 512, (batch,)).tolist()
    k, v, tables, seq_lens = paged_cache(lens, dtype)
    q = torch.randn(batch, HEADS, HEAD_DIM).to(dtype)
    compare(
        "decode attention (contexts 64-511)",
        lambda: decode_attention._decode_torch(q, k, v, tables, seq_lens, 0.125),
        lambda: kernels.paged_decode_attention(q, k, v, tables, seq_lens, 0.125),
        rounds,
        10,
    )
    x, residual = torch.randn(2, batch, HIDDEN).to(dtype)
    weight = torch.randn(HIDDEN).to(dtype)
    compare(
        "residual add + RMSNorm",
        lambda: norm._norm_torch(x + residual, weight, 1e-5),
        lambda: kernels.add_rms_norm(x, residual, weight, 1e-5),
        rounds,
        50,
    )
    qkv = torch.randn(batch, (HEADS + 2 * KV_HEADS) * HEAD_DIM).to(dtype)
    qk = qkv[:, : (HEADS + KV_HEADS) * HEAD_DIM].view(batch, HEADS + KV_HEADS, HEAD_DIM)
    cos_sin = torch.randn(2048, 2 * HEAD_DIM).to(dtype)
    positions = torch.tensor(lens)
    compare(
        "RoPE on q and k",
        lambda: old_rope(qk[:, :HEADS], qk[:, HEADS:], cos_sin, positions),
        lambda: kernels.apply_rope_(qk, cos_sin, positions),
        rounds,
        50,
    )
    # LoRA: 16 rank-8 adapters over the batch, sorted by slot, gate_up (576 -> 2 x 1536).
    slots = torch.sort(torch.randint(0, 16, (batch,))).values
    index = kernels.lora_index(slots, 16)
    a = torch.randn(16, 16, HIDDEN).to(dtype) * 0.05
    b = torch.randn(16, 16, 2 * 1536).to(dtype).transpose(1, 2) * 0.05
    scales = torch.full((16,), 2.0)
    xs = torch.randn(batch, HIDDEN).to(dtype)
    out = torch.randn(batch, 2 * 1536).to(dtype)

    def torch_lora():
        with mock.patch.object(lora_torch, "native_lora", lambda: None):
            kernels.lora_apply(xs, a, b, slots, scales.to(dtype), out, index=index)

    compare(
        "LoRA gate_up, 16 adapters, rank 8",
        torch_lora,
        lambda: kernels.lora_apply(xs, a, b, slots, scales, out, index=index),
        rounds,
        10,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "both"], default="both")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument(
        "--clock",
        choices=list(CLOCK),
        default="wall",
        help="cpu: this process's CPU time, steadier on a loaded machine (counts every thread)",
    )
    args = parser.parse_args()
    global clock
    clock = CLOCK[args.clock]
    dtypes = ["float32", "bfloat16"] if args.dtype == "both" else [args.dtype]
    for name in dtypes:
        run(getattr(torch, name), args.rounds, args.batch)


if __name__ == "__main__":
    main()
