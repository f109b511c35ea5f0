"""Prefix caching under a SaaS workload (issue 8): each of 16 adapters has its own ~400-token
system prompt, sent again with every request to that adapter.

Each request is its adapter's system prompt followed by a short question of its own (seeded
random tokens, so lengths are exact), streamed through `loragate serve` in a subprocess (as
benchmarks/serve.py runs it), once with prefix caching on and once with it off. Requests go
to the adapters in turn, at most --max-concurrency in flight; the first request of each
adapter is measured too, so the cold misses are in the numbers.

Reports p50/p90 TTFT and output throughput per setting, the ratio of p50 TTFT (goal: at
least 3x lower with caching on), and the KV waste read from /metrics while the requests run
(internal fragmentation: unused slots in last blocks / allocated slots, slot-weighted over
the samples; goal under 4%) beside what an HF-style cache that preallocates max_model_len
per sequence would waste for the same requests. Rows print as each run ends; a markdown
table and a JSON file at the end.

    .venv/bin/python benchmarks/prefix_caching.py    # 64 requests, concurrency 16: minutes

A one-minute smoke run: --num-requests 8 --num-adapters 2 --max-concurrency 4.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import random
import re
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np

# benchmarks/ is not a package: running this file puts its folder first on sys.path.
from serve import ServerProcess, http_sender, make_adapters, run_workload
from serve_workloads import Request, arrival_times

from loragate.engine import EngineConfig
from loragate.engine.loading.model_loader import resolve_model

_SAMPLE = re.compile(r"^(loragate_[a-z_]+)\s+(\S+)$")


# ---- the workload ---------------------------------------------------------------------------
def make_workload(args, vocab_size: int, adapters: list[str]) -> list[Request]:
    """Adapter i's system prompt + a question of its own, adapters in turn."""
    rng = random.Random(args.seed)

    def tokens(n: int) -> list[int]:
        return [rng.randrange(1000, vocab_size - 1000) for _ in range(n)]

    system = {name: tokens(args.system_len) for name in adapters}
    arrivals = arrival_times(args.num_requests, args.request_rate, 1.0, rng)
    requests = []
    for i, arrival in enumerate(arrivals):
        adapter = adapters[i % len(adapters)]
        question = tokens(rng.randint(args.question_len // 2, args.question_len * 3 // 2))
        requests.append(Request(system[adapter] + question, args.output_len, adapter, arrival))
    return requests


def warmup_requests(args, vocab_size: int, adapters: list[str]) -> list[Request]:
    """One short request per adapter, sharing nothing with the system prompts: adapter
    loads and first-call costs stay out of the timed run, and the prefix cache stays cold."""
    rng = random.Random(args.seed + 1)
    return [
        Request([rng.randrange(1000, vocab_size - 1000) for _ in range(8)], 2, name, 0.0)
        for name in adapters
    ]


# ---- KV memory, read from /metrics while the requests run ------------------------------------
@dataclass
class KVSamples:
    allocated_blocks: list[float] = field(default_factory=list)
    fragmentation: list[float] = field(default_factory=list)

    def add(self, m: dict[str, float]) -> None:
        if m.get("loragate_kv_cache_allocated_blocks", 0) > 0:
            self.allocated_blocks.append(m["loragate_kv_cache_allocated_blocks"])
            self.fragmentation.append(m["loragate_kv_cache_internal_fragmentation"])

    def waste(self) -> float:
        """Wasted slots / allocated slots, summed over the samples."""
        alloc = np.asarray(self.allocated_blocks)
        return (
            float((np.asarray(self.fragmentation) * alloc).sum() / alloc.sum())
            if len(alloc)
            else float("nan")
        )

    def max_waste(self) -> float:
        return max(self.fragmentation, default=float("nan"))


async def scrape(client: httpx.AsyncClient, url: str) -> dict[str, float]:
    text = (await client.get(f"{url}/metrics")).text
    found = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match:
            found[match.group(1)] = float(match.group(2))
    return found


async def sample_kv(client, url: str, into: KVSamples, every: float, stop: asyncio.Event):
    while not stop.is_set():
        into.add(await scrape(client, url))
        try:
            await asyncio.wait_for(stop.wait(), every)
        except TimeoutError:
            pass


# ---- one run --------------------------------------------------------------------------------
def run(args, config, requests, warmup, adapter_dir, result_dir, caching: bool) -> dict:
    flag = "--enable-prefix-caching" if caching else "--no-enable-prefix-caching"
    label = "on" if caching else "off"
    log = result_dir / f"prefix_caching_{label}_server.log"
    server = ServerProcess(config, adapter_dir, log, extra_args=(flag,))
    try:
        limits = httpx.Limits(
            max_connections=args.max_concurrency + 8,
            max_keepalive_connections=args.max_concurrency + 8,
        )

        async def go():
            async with httpx.AsyncClient(timeout=None, limits=limits) as client:
                base = (await client.get(f"{server.url}/v1/models")).json()["data"][0]["id"]
                send = http_sender(client, server.url, base)
                await run_workload(warmup, send, args.max_concurrency)
                before = await scrape(client, server.url)
                samples, stop = KVSamples(), asyncio.Event()
                sampler = asyncio.create_task(
                    sample_kv(client, server.url, samples, args.sample_interval, stop)
                )
                results, duration = await run_workload(requests, send, args.max_concurrency)
                stop.set()
                await sampler
                after = await scrape(client, server.url)
                return results, duration, samples, before, after

        results, duration, samples, before, after = asyncio.run(go())
    finally:
        server.stop()
    return summarize(label, results, duration, samples, before, after, args.max_model_len)


def summarize(label, results, duration, samples: KVSamples, before, after, max_model_len):
    ok = [r for r in results if r.ok]
    ttft_ms = np.asarray([r.ttft for r in ok]) * 1e3 if ok else np.asarray([math.nan])
    hits = after["loragate_prefix_cache_hit_tokens_total"] - before.get(
        "loragate_prefix_cache_hit_tokens_total", 0
    )
    queried = after["loragate_prefix_cache_queried_tokens_total"] - before.get(
        "loragate_prefix_cache_queried_tokens_total", 0
    )
    used = sum(r.prompt_tokens + r.output_tokens for r in ok)
    errors = sorted({r.error for r in results if not r.ok})
    return {
        "prefix_caching": label,
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "duration_s": duration,
        "ttft_p50_ms": float(np.percentile(ttft_ms, 50)),
        "ttft_p90_ms": float(np.percentile(ttft_ms, 90)),
        "output_token_throughput": sum(r.output_tokens for r in ok) / duration,
        "prefix_cache_hit_rate": hits / queried if queried else 0.0,
        "kv_waste": samples.waste(),
        "kv_waste_max": samples.max_waste(),
        "kv_samples": len(samples.fragmentation),
        # HF's static cache holds max_model_len slots per sequence, whatever it uses.
        "hf_preallocated_waste": 1 - used / (len(ok) * max_model_len) if ok else math.nan,
    } | ({"errors": errors[:5]} if errors else {})


# ---- report ---------------------------------------------------------------------------------
COLUMNS = [
    ("prefix caching", "prefix_caching", "{}"),
    ("requests", "completed", "{:.0f}"),
    ("failed", "failed", "{:.0f}"),
    ("duration (s)", "duration_s", "{:.1f}"),
    ("TTFT p50 (ms)", "ttft_p50_ms", "{:.0f}"),
    ("TTFT p90 (ms)", "ttft_p90_ms", "{:.0f}"),
    ("output tok/s", "output_token_throughput", "{:.1f}"),
    ("prefix hit rate", "prefix_cache_hit_rate", "{:.1%}"),
    ("KV waste", "kv_waste", "{:.2%}"),
    ("KV waste max", "kv_waste_max", "{:.2%}"),
    ("HF preallocated waste", "hf_preallocated_waste", "{:.1%}"),
]


def row(run: dict) -> str:
    return "| " + " | ".join(fmt.format(run[key]) for _, key, fmt in COLUMNS) + " |"


def table(runs: list[dict]) -> str:
    header = "| " + " | ".join(name for name, _, _ in COLUMNS) + " |"
    return "\n".join([header, "|---" * len(COLUMNS) + "|", *map(row, runs)])


# ---- main -----------------------------------------------------------------------------------
def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", default=None, help="HF dir or .gguf; default: SmolLM2-135M-Instruct")
    p.add_argument("--num-requests", type=int, default=64)
    p.add_argument("--max-concurrency", type=int, default=16)
    p.add_argument(
        "--request-rate", type=float, default=math.inf, help="requests/s (Poisson); inf = all"
    )
    p.add_argument("--num-adapters", type=int, default=16)
    p.add_argument("--adapter-rank", type=int, default=8)
    p.add_argument("--adapter-dir", default=None, help="where the random adapters are kept")
    p.add_argument("--system-len", type=int, default=400, help="system prompt tokens")
    p.add_argument("--question-len", type=int, default=16, help="mean question tokens")
    p.add_argument("--output-len", type=int, default=24, help="max_tokens of every request")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sample-interval", type=float, default=0.25, help="seconds between scrapes")
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument("--kv-cache-memory-gb", type=float, default=1.0)
    p.add_argument("--result-dir", default="benchmarks/results")
    return p.parse_args(argv)


def main(argv=None) -> dict:
    args = parse_args(argv)
    result_dir = Path(args.result_dir)
    result_dir.mkdir(parents=True, exist_ok=True)
    hf_dir = resolve_model(args.model).hf_dir
    adapter_dir, names = make_adapters(
        hf_dir, args.num_adapters, args.adapter_rank, adapter_dir=args.adapter_dir
    )
    config = EngineConfig(
        model=args.model,
        max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        kv_cache_memory_gb=args.kv_cache_memory_gb,
        enable_lora=True,
        max_loras=max(1, args.num_adapters),  # every adapter may share a step
        max_lora_rank=max(8, args.adapter_rank),
        max_cpu_loras=max(1, args.num_adapters),
    )
    vocab = json.loads((hf_dir / "config.json").read_text())["vocab_size"]
    requests = make_workload(args, vocab, names)
    warmup = warmup_requests(args, vocab, names)
    print(
        f"{len(requests)} requests over {len(names)} adapters, system prompt {args.system_len} "
        f"tokens, max_tokens {args.output_len}, concurrency {args.max_concurrency}",
        flush=True,
    )
    print("\n" + table([]), flush=True)
    runs = []
    for caching in (True, False):
        runs.append(run(args, config, requests, warmup, adapter_dir, result_dir, caching))
        print(row(runs[-1]), flush=True)
        if "errors" in runs[-1]:
            print(f"  errors: {runs[-1]['errors']}", flush=True)
    on, off = runs
    ratio = off["ttft_p50_ms"] / on["ttft_p50_ms"]
    print("\n" + table(runs))
    print(
        f"\np50 TTFT, caching off / on: {ratio:.1f}x (goal: at least 3x)\n"
        f"KV waste (internal fragmentation from /metrics, {on['kv_samples']} + "
        f"{off['kv_samples']} samples): on {on['kv_waste']:.2%}, off {off['kv_waste']:.2%} "
        f"(goal: under 4%); an HF-style cache preallocating max_model_len={args.max_model_len} "
        f"per sequence: {on['hf_preallocated_waste']:.1%} at best (counted at each request's "
        f"end)",
        flush=True,
    )
    report = {
        "settings": vars(args) | {"request_rate": str(args.request_rate)},
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, torch threads default",
        "runs": runs,
        "ttft_p50_ratio": ratio,
    }
    path = result_dir / f"prefix-caching-{args.num_requests}x{args.max_concurrency}.json"
    path.write_text(json.dumps(report, indent=2, default=str))
    print(f"\nwrote {path}", flush=True)
    return report


if __name__ == "__main__":
    main()
