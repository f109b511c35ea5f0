"""Kernel micro-benchmark: each op's time against its floor, Triton vs torch on CUDA.

The floor of a memory-bound op is bytes moved / measured copy bandwidth; of a compute-bound op,
FLOPs / measured matmul rate (both measured here, on this machine). On CUDA every Triton op is
timed with triton.testing.do_bench (median) beside its torch version; on CPU only the torch
versions run (the Triton interpreter is a correctness tool, not a speed one).

    .venv/bin/python benchmarks/kernels.py            # everything (CPU: about a minute)
    .venv/bin/python benchmarks/kernels.py --ops lora decode --threads 1

On CUDA the Triton ops are also timed replayed from a CUDA graph, as the engine's decode
steps run them, which takes the host's launch cost out. Goals on an H100/H200: paged decode
attention >= 60% of copy bandwidth at batch 64, context 2048; LoRA shrink+expand, 64 tokens
over 32 distinct rank-16 adapters, within 1.5x of one dense matmul of the same FLOPs
(Punica's SGMV result).
"""

from __future__ import annotations

import argparse
import datetime
import math
import platform
from collections.abc import Callable

import torch

from loragate import kernels

# SmolLM2-135M attention: 9 query heads over 3 KV heads of 64; hidden 576, intermediate 1536.
HEADS, KV_HEADS, HEAD_DIM, BLOCK_SIZE = 9, 3, 64, 16


class Bench:
    """Timing and floors for one device."""

    def __init__(self, device: str):
        self.device = device
        self.cuda = device == "cuda"
        self.dtype = torch.bfloat16 if self.cuda else torch.float32
        self.copy_gbps = self._copy_bandwidth()
        self.matmul_tflops = self._matmul_rate()

    def time_us(self, fn: Callable[[], object], graph: bool = False) -> float:
        """graph=True (CUDA): replayed from a CUDA graph, as the engine's decode steps run,
        so the host's launch cost drops out and the kernel's own time remains."""
        if self.cuda:
            import triton.testing

            if graph:
                return triton.testing.do_bench_cudagraph(fn, return_mode="median") * 1e3
            return triton.testing.do_bench(fn, return_mode="median") * 1e3
        from torch.utils.benchmark import Timer

        return Timer("fn()", globals={"fn": fn}).blocked_autorange(min_run_time=0.2).median * 1e6

    def _copy_bandwidth(self) -> float:
        """GB/s of a large device-to-device copy (bytes read + bytes written)."""
        n = (256 if self.cuda else 32) * 2**20
        src = torch.empty(n, dtype=torch.float32, device=self.device).normal_()
        dst = torch.empty_like(src)
        return 2 * src.nbytes / self.time_us(lambda: dst.copy_(src)) / 1e3

    def _matmul_rate(self) -> float:
        """TFLOP/s of a large square matmul in the benchmark dtype."""
        n = 8192 if self.cuda else 1024
        a = torch.randn(n, n, dtype=self.dtype, device=self.device)
        b = torch.randn(n, n, dtype=self.dtype, device=self.device)
        return 2 * n**3 / self.time_us(lambda: a @ b) / 1e6

    def floor_us(self, nbytes: float = 0.0, flops: float = 0.0) -> float:
        return max(nbytes / (self.copy_gbps * 1e3), flops / (self.matmul_tflops * 1e6))

    def row(self, name: str, torch_fn, triton_fn, nbytes=0.0, flops=0.0, graph=True) -> str:
        """graph=False for an op the engine never replays from a graph (prefill attention
        reads its chunks' offsets on the host): its graph columns say so."""
        floor = self.floor_us(nbytes, flops)
        t_torch = self.time_us(torch_fn)
        cells = [name, f"{t_torch:.1f}", f"{floor / t_torch:.0%}"]
        if self.cuda:
            t_triton = self.time_us(triton_fn)
            cells += [f"{t_triton:.1f}", f"{floor / t_triton:.0%}", f"{t_torch / t_triton:.1f}x"]
            if graph:
                t_graph = self.time_us(triton_fn, graph=True)
                cells += [f"{t_graph:.1f}", f"{floor / t_graph:.0%}"]
            else:
                cells += ["not graphed", "-"]
        cells.append(f"{floor:.1f}")
        return "| " + " | ".join(cells) + " |"

    def header(self, first: str) -> str:
        cols = [first, "torch us", "torch % of floor"]
        if self.cuda:
            cols += ["triton us", "triton % of floor", "speedup"]
            cols += ["triton in graph us", "in graph % of floor"]
        cols.append("floor us")
        return "| " + " | ".join(cols) + " |\n|" + "---|" * len(cols)


def paged_cache(bench: Bench, batch: int, context: int):
    blocks = batch * math.ceil(context / BLOCK_SIZE)
    shape = (blocks, BLOCK_SIZE, KV_HEADS, HEAD_DIM)
    k_cache = torch.randn(shape, dtype=bench.dtype, device=bench.device)
    v_cache = torch.randn_like(k_cache)
    tables = torch.randperm(blocks, device=bench.device).view(batch, -1).to(torch.int32)
    seq_lens = torch.full((batch,), context, dtype=torch.int32, device=bench.device)
    return k_cache, v_cache, tables, seq_lens


def bench_decode(bench: Bench) -> None:
    print("\n### paged_decode_attention (floor: K+V bytes / copy bandwidth)\n")
    print(bench.header("batch x context"))
    batches = [1, 16, 64, 256] if bench.cuda else [1, 16, 64]
    contexts = [128, 512, 2048, 4096] if bench.cuda else [128, 512, 2048]
    for batch in batches:
        for context in contexts:
            if not bench.cuda and batch * context > 64 * 512:
                continue
            k_cache, v_cache, tables, lens = paged_cache(bench, batch, context)
            q = torch.randn(batch, HEADS, HEAD_DIM, dtype=bench.dtype, device=bench.device)
            nbytes = 2 * k_cache.nbytes + 2 * q.nbytes

            def run(backend, q=q, k=k_cache, v=v_cache, t=tables, n=lens):
                return lambda: kernels.paged_decode_attention(q, k, v, t, n, 0.125, backend)

            print(bench.row(f"{batch} x {context}", run("torch"), run("triton"), nbytes=nbytes))


def bench_prefill(bench: Bench) -> None:
    print("\n### paged_prefill_attention (floor: causal attention FLOPs / matmul rate)\n")
    print(bench.header("seqs x new/context"))
    shapes = [(1, 512, 512), (4, 512, 512), (4, 256, 1024), (16, 1024, 1024)]
    for seqs, q_len, context in shapes if bench.cuda else shapes[:3]:
        k_cache, v_cache, tables, lens = paged_cache(bench, seqs, context)
        q = torch.randn(seqs * q_len, HEADS, HEAD_DIM, dtype=bench.dtype, device=bench.device)
        starts = torch.arange(0, seqs * q_len + 1, q_len, dtype=torch.int32, device=bench.device)
        visible_pairs = seqs * q_len * (context - q_len + (q_len + 1) / 2)
        flops = 4 * visible_pairs * HEADS * HEAD_DIM

        def run(backend, q=q, k=k_cache, v=v_cache, t=tables, n=lens, s=starts):
            return lambda: kernels.paged_prefill_attention(q, k, v, t, n, s, 0.125, backend)

        name = f"{seqs} x {q_len}/{context}"
        print(bench.row(name, run("torch"), run("triton"), flops=flops, graph=False))


def bench_write_kv(bench: Bench) -> None:
    print("\n### write_kv (floor: K+V read + written / copy bandwidth)\n")
    print(bench.header("tokens"))
    for tokens in [1, 64, 256, 4096]:
        k_cache, v_cache, _, _ = paged_cache(bench, 1, tokens + BLOCK_SIZE)
        key = torch.randn(tokens, KV_HEADS, HEAD_DIM, dtype=bench.dtype, device=bench.device)
        value = torch.randn_like(key)
        slots = torch.randperm(k_cache.shape[0] * BLOCK_SIZE, device=bench.device)[:tokens]

        def run(backend, key=key, value=value, k=k_cache, v=v_cache, s=slots):
            return lambda: kernels.write_kv(key, value, k, v, s, backend)

        print(bench.row(str(tokens), run("torch"), run("triton"), nbytes=4 * key.nbytes))


def bench_lora(bench: Bench) -> None:
    d_in, d_out = (4096, 4096) if bench.cuda else (576, 1536)
    print(
        f"\n### lora_apply (shrink + expand), d_in {d_in}, d_out {d_out}, rank 16, "
        "stack of 64 slots padded to rank 64, passed as [:, :16] views in the engine's layout "
        "(B stored transposed)\n"
        "(floor: the same FLOPs as ONE dense x @ A^T and y @ B^T matmul pair, timed here; "
        "'base' is x @ W^T of the full projection; 'sorted': the batch already grouped by slot)\n"
    )
    cols = ["tokens x adapters", "torch us", "torch sorted us", "torch / dense pair"]
    if bench.cuda:
        cols += ["triton us", "triton / dense pair"]
        cols += ["in graph: triton us", "dense pair us", "triton / dense pair"]
    cols += ["dense pair us", "base x@W^T us", "torch / base"]
    print("| " + " | ".join(cols) + " |\n|" + "---|" * len(cols))
    slots, rank = 64, 16
    lora_a = torch.randn(slots, 64, d_in, dtype=bench.dtype, device=bench.device)[:, :rank]
    lora_bt = torch.randn(slots, 64, d_out, dtype=bench.dtype, device=bench.device)
    lora_b = lora_bt[:, :rank].transpose(1, 2)
    scales = torch.rand(slots, device=bench.device)
    weight = torch.randn(d_out, d_in, dtype=bench.dtype, device=bench.device)
    token_counts = [1, 16, 64, 256] if bench.cuda else [1, 16, 64, 256]
    for tokens in token_counts:
        for distinct in [1, 4, 16, 32, 64]:
            if distinct > tokens:
                continue
            x = torch.randn(tokens, d_in, dtype=bench.dtype, device=bench.device)
            out = torch.zeros(tokens, d_out, dtype=bench.dtype, device=bench.device)
            slot_ids = torch.arange(tokens, device=bench.device) % distinct
            slot_ids = slot_ids[torch.randperm(tokens, device=bench.device)]
            index = kernels.lora_index(slot_ids, slots)

            sorted_ids = slot_ids.sort().values
            sorted_index = kernels.lora_index(sorted_ids, slots)

            def run(backend, x=x, out=out, slot_ids=slot_ids, index=index):
                return lambda: kernels.lora_apply(
                    x, lora_a, lora_b, slot_ids, scales, out, backend, index=index
                )

            a_dense, b_dense = lora_a[0].contiguous(), lora_b[0].contiguous()
            dense = bench.time_us(lambda x=x, a=a_dense, b=b_dense: (x @ a.T) @ b.T)
            base = bench.time_us(lambda x=x: x @ weight.T)
            t_torch = bench.time_us(run("torch"))
            t_sorted = bench.time_us(run("torch", slot_ids=sorted_ids, index=sorted_index))
            cells = [f"{tokens} x {distinct}", f"{t_torch:.1f}", f"{t_sorted:.1f}"]
            cells.append(f"{t_torch / dense:.2f}x")
            if bench.cuda:
                t_triton = bench.time_us(run("triton"))
                cells += [f"{t_triton:.1f}", f"{t_triton / dense:.2f}x"]
                g_triton = bench.time_us(run("triton"), graph=True)
                g_dense = bench.time_us(
                    lambda x=x, a=a_dense, b=b_dense: (x @ a.T) @ b.T, graph=True
                )
                cells += [f"{g_triton:.1f}", f"{g_dense:.1f}", f"{g_triton / g_dense:.2f}x"]
            cells += [f"{dense:.1f}", f"{base:.1f}", f"{t_torch / base:.0%}"]
            print("| " + " | ".join(cells) + " |")


OPS = {
    "decode": bench_decode,
    "prefill": bench_prefill,
    "write_kv": bench_write_kv,
    "lora": bench_lora,
}


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", nargs="*", default=list(OPS), choices=list(OPS))
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    bench = Bench(args.device)
    name = torch.cuda.get_device_name() if bench.cuda else _cpu_name()
    print(f"## Kernels on {name} ({args.device}), {datetime.date.today()}")
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} CPU threads, dtype "
        f"{str(bench.dtype).removeprefix('torch.')}; measured copy bandwidth "
        f"{bench.copy_gbps:.1f} GB/s, matmul {bench.matmul_tflops * 1e3:.0f} GFLOP/s"
    )
    for op in args.ops:
        OPS[op](bench)


if __name__ == "__main__":
    main()
