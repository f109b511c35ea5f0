"""Online serving benchmark, shaped like `vllm bench serve`, against vLLM-CPU and in-process.

One seeded workload runs through the same streaming client (POST /v1/completions,
stream=true) against each server, one at a time, in one invocation:

  loragate        `loragate serve` in a subprocess, as deployed;
  loragate-fixed  the same with a fixed --fixed-budget (4096 was the old default), to show
                  what stall-free steps change;
  vllm            vLLM-CPU's OpenAI api_server on the same adapters (benchmarks/serve_peer.py;
                  needs the peer venv of ../shared/peers/setup_vllm.sh);
  llamacpp        llama.cpp's llama-server on the same GGUF file and the same adapters as
                  GGUF LoRA (benchmarks/serve_peer_llamacpp.py; needs
                  ../shared/peers/setup_llamacpp.sh's build), `--peer llamacpp`;
  engine          the same requests straight into AsyncLLMEngine in this process: no HTTP,
                  no JSON, no SSE (the difference is the gateway's overhead).

Workloads: `random` (random-token prompts and output lengths, Poisson or gamma arrivals at
--request-rate, at most --max-concurrency in flight, adapters by power-law popularity) and
`long-mix` (--streams requests at once; once each streams, --long-prompts prompts of
--long-len tokens arrive). Reports request and token throughput, TTFT, TPOT, ITL and E2E
latency (mean, p50, p90, p99) and goodput under an SLO, as a table and a JSON file, with
PNG plots drawn with matplotlib (the `bench` extra): latency CDFs, ITL over time of one
stream, and with --concurrency-sweep, throughput and TTFT against concurrency.

    .venv/bin/python benchmarks/serve.py --num-prompts 64 --input-len 256 --output-len 64 \
        --range-ratio 0 --num-adapters 16 --skip-engine
    .venv/bin/python benchmarks/serve.py --workload long-mix --skip-engine --fixed-budget 4096
    .venv/bin/python benchmarks/serve.py --skip-engine --peer none --concurrency-sweep 1,4,16,64

Issue 59's W2 against llama-server, on the default model's Q4_1 file (64 requests at once,
16 adapters on all seven projections, power-law popularity), and loragate's own float32
copy of the same file (`--gguf-dequantize` serves it dequantized):

    .venv/bin/python benchmarks/serve.py --peer llamacpp --skip-engine --num-prompts 64 \
        --request-rate inf --max-concurrency 64 --num-adapters 16 --base-fraction 0 \
        --adapter-targets all --also-dequantized

The prefix-caching workload (16 adapters, each with its own 400-token system prompt; TTFT
and KV waste with caching on and off) is benchmarks/prefix_caching.py, built on this file.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path

import httpx
from plots import (
    plot_itl_over_time,
    plot_latency_distributions,
    plot_throughput_vs_concurrency,
)
from serve_args import parse_args
from serve_peer import VLLMServer, peer_python
from serve_peer_llamacpp import LlamaCppServer, gguf_lora
from serve_report import overhead, summarize, sweep_table, table
from serve_workloads import Request, Result, make_long_mix, make_workload
from server_process import stop_process

from loragate.adapters import LoRARequest
from loragate.engine import EngineConfig, SamplingParams
from loragate.engine.api.async_engine import AsyncLLMEngine
from loragate.engine.loading.default_model import default_model_path
from loragate.engine.loading.model_loader import resolve_model
from loragate.tools import make_random_adapter

ADAPTER_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]
ALL_TARGETS = [*ADAPTER_TARGETS, "gate_proj", "up_proj", "down_proj"]


# ---- the workload ---------------------------------------------------------------------------
async def run_workload(requests: list[Request], send, max_concurrency: int):
    """Send each request at its arrival time (bounded by max_concurrency); time the run."""
    limit = asyncio.Semaphore(max_concurrency)
    start = time.perf_counter()
    first_tokens = 0
    gates: dict[int, asyncio.Event] = {
        r.after_first_tokens: asyncio.Event() for r in requests if r.after_first_tokens
    }

    def on_first() -> None:
        nonlocal first_tokens
        first_tokens += 1
        for n, gate in gates.items():
            if first_tokens >= n:
                gate.set()

    async def one(request: Request) -> Result:
        opened = start
        if request.after_first_tokens:
            await gates[request.after_first_tokens].wait()
            opened = time.perf_counter()
        delay = request.arrival - (time.perf_counter() - opened)
        if delay > 0:
            await asyncio.sleep(delay)
        async with limit:
            try:
                return await send(request, on_first)
            except Exception as exc:  # a failed request is counted, not fatal
                return Result(ok=False, error=f"{type(exc).__name__}: {exc}")

    results = await asyncio.gather(*(one(r) for r in requests))
    return results, time.perf_counter() - start


def _timed(token_times: list[float], sent: float, prompt_tokens: int, output_tokens: int):
    return Result(
        ok=True,
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        ttft=token_times[0] - sent,
        e2e=token_times[-1] - sent,
        itl=[b - a for a, b in zip(token_times, token_times[1:], strict=False)],
        token_times=token_times,
    )


def http_sender(
    client: httpx.AsyncClient, url: str, base_model: str, lora_ids: dict[str, int] | None = None
):
    """``lora_ids``: llama-server's way, the base model named and the adapter given by its
    index in the server's `--lora` list; without it, the adapter is the request's model."""

    async def send(request: Request, on_first=None) -> Result:
        body = {
            "model": base_model if lora_ids is not None else request.adapter or base_model,
            "prompt": request.prompt_ids,
            "max_tokens": request.max_tokens,
            "ignore_eos": True,
            "temperature": 0.0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if lora_ids is not None and request.adapter:
            body["lora"] = [{"id": lora_ids[request.adapter], "scale": 1.0}]
        sent = time.perf_counter()
        token_times, usage = [], None
        async with client.stream("POST", f"{url}/v1/completions", json=body) as response:
            if response.status_code != 200:
                return Result(ok=False, error=f"HTTP {response.status_code}")
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    usage = chunk["usage"]
                elif chunk["choices"] and chunk["choices"][0]["text"]:
                    token_times.append(time.perf_counter())
                    if len(token_times) == 1 and on_first is not None:
                        on_first()
        if usage is None or not token_times:
            return Result(ok=False, error="stream ended without usage or tokens")
        return _timed(token_times, sent, usage["prompt_tokens"], usage["completion_tokens"])

    return send


def engine_sender(engine: AsyncLLMEngine, loras: dict[str, LoRARequest]):
    ids = iter(range(1 << 62))

    async def send(request: Request, on_first=None) -> Result:
        params = SamplingParams(temperature=0.0, max_tokens=request.max_tokens, ignore_eos=True)
        lora = loras[request.adapter] if request.adapter else None
        sent = time.perf_counter()
        token_times, seen, out = [], 0, None
        prompt = {"prompt_token_ids": request.prompt_ids}
        async for out in engine.generate(prompt, params, f"bench-{next(ids)}", lora_request=lora):
            n = len(out.outputs[0].token_ids)
            if n > seen:
                token_times.append(time.perf_counter())
                if not seen and on_first is not None:
                    on_first()
                seen = n
        return _timed(token_times, sent, len(out.prompt_token_ids), seen)

    return send


# ---- the two servers ------------------------------------------------------------------------
def engine_config(args, adapter_dir: Path) -> EngineConfig:
    slots = args.num_adapters if args.max_loras is None else args.max_loras
    return EngineConfig(
        model=args.model,
        dtype=args.dtype,
        max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_step_ms=args.max_step_ms,
        scheduling_policy=args.scheduling_policy,
        kv_cache_memory_gb=args.kv_cache_memory_gb,
        enable_lora=True,
        max_loras=max(1, min(slots, max(args.num_adapters, 1))),
        max_lora_rank=max(8, args.adapter_rank),
        max_cpu_loras=max(args.num_adapters, slots, 1),
    )


class ServerProcess:
    """`loragate serve` in a subprocess, as deployed: its own interpreter and GIL."""

    def __init__(
        self, config: EngineConfig, adapter_dir: Path, log_path: Path, extra_args: tuple = ()
    ):
        args = (
            [
                sys.executable,
                "-m",
                "loragate.gateway.assembly.cli",
                "serve",
                "--port",
                "0",
                "--adapter-root",
                str(adapter_dir),
                "--max-queue",
                "100000",
                "--max-model-len",
                str(config.max_model_len),
                "--max-num-seqs",
                str(config.max_num_seqs),
                "--max-step-ms",
                str(config.max_step_ms),
                "--scheduling-policy",
                config.scheduling_policy,
                "--kv-cache-memory-gb",
                str(config.kv_cache_memory_gb),
                "--max-loras",
                str(config.max_loras),
                "--max-lora-rank",
                str(config.max_lora_rank),
                "--max-cpu-loras",
                str(config.max_cpu_loras),
                "--dtype",
                config.dtype,
            ]
            + (["--model", config.model] if config.model else [])
            + list(extra_args)
        )
        if config.max_num_batched_tokens is not None:
            args += ["--max-num-batched-tokens", str(config.max_num_batched_tokens)]
        self.log = open(log_path, "w")  # noqa: SIM115  (closed in stop)
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=self.log, text=True)
        self.url = ""
        ready = threading.Event()

        def read():
            for line in self.proc.stdout:
                if "listening on" in line:
                    self.url = line.split("listening on", 1)[1].strip()
                    ready.set()

        threading.Thread(target=read, daemon=True).start()
        deadline = time.monotonic() + 900
        while not ready.wait(0.5):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the server did not start; see {log_path}")

    def stop(self) -> None:
        stop_process(self.proc, self.log, 120)


def make_adapters(
    hf_dir: Path,
    count: int,
    rank: int = 8,
    targets: str = "attention",
    adapter_dir: str | Path | None = None,
) -> tuple[Path, list[str]]:
    """`count` random adapters bench-0, bench-1, ... of `rank` on `targets` ("attention":
    q/k/v/o, or "all" seven projections), made once and kept under `adapter_dir` (None: the
    temporary folder's loragate-bench-adapters); their folder and names."""
    names = [f"bench-{i}" for i in range(count)]
    root = Path(adapter_dir or Path(tempfile.gettempdir()) / "loragate-bench-adapters")
    every = targets == "all"
    root = root / f"{hf_dir.name}-r{rank}" / ("all" if every else "")
    targets = ALL_TARGETS if every else ADAPTER_TARGETS
    missing = [n for n in names if not (root / n / "adapter_model.safetensors").is_file()]
    if missing:
        import torch
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
        for name in missing:
            make_random_adapter(
                model,
                root / name,
                rank=rank,
                targets=targets,
                seed=names.index(name),
            )
    root.mkdir(parents=True, exist_ok=True)
    return root, names


def run_http(
    args, config, requests, adapter_dir, result_dir, name="server", extra_args: tuple = ()
) -> tuple[list[Result], float]:
    server = ServerProcess(config, adapter_dir, result_dir / f"serve_{name}.log", extra_args)
    try:
        return _run_client(args, server.url, requests)
    finally:
        server.stop()


def run_concurrency_sweep(args, config, requests, adapter_dir, result_dir, slo) -> list[dict]:
    """One loragate server, the same requests at each --concurrency-sweep level."""
    server = ServerProcess(config, adapter_dir, result_dir / "serve_sweep.log")
    points = []
    try:
        for level in args.concurrency_sweep:
            sweep_args = argparse.Namespace(**(vars(args) | {"max_concurrency": level}))
            results, duration = _run_client(sweep_args, server.url, requests)
            points.append({"max_concurrency": level} | summarize(results, duration, slo))
            print(
                f"concurrency {level}: {points[-1]['output_token_throughput']:.1f} tok/s, "
                f"TTFT p50 {points[-1]['ttft_p50_ms']:.0f} ms",
                flush=True,
            )
    finally:
        server.stop()
    return points


def run_peer(args, config, requests, adapter_dir, names, result_dir):
    """The same requests through the same client against vLLM-CPU's api_server."""
    server = VLLMServer(
        peer_python(),
        adapter_dir,
        names,
        max_num_seqs=config.max_num_seqs,
        max_model_len=config.max_model_len,
        max_lora_rank=config.max_lora_rank,
        log_path=result_dir / "serve_vllm.log",
        dtype=config.dtype,
    )
    try:
        return _run_client(args, server.url, requests)
    finally:
        server.stop()


def run_llamacpp(args, config, requests, adapter_dir, names, result_dir):
    """The same requests through the same client against llama-server on the same GGUF file
    (the default model's Q4_1 unless --model names another .gguf)."""
    model = Path(args.model) if args.model else default_model_path()
    if model.suffix != ".gguf":
        raise SystemExit("--peer llamacpp serves a .gguf file: give --model FILE.gguf")
    base_hf = resolve_model(args.model).hf_dir
    loras = [gguf_lora(adapter_dir / n, base_hf, adapter_dir / "gguf") for n in names]
    server = LlamaCppServer(
        model,
        loras,
        slots=config.max_num_seqs,
        slot_len=config.max_model_len,
        threads=os.cpu_count() or 1,
        log_path=result_dir / "serve_llamacpp.log",
    )
    try:
        return _run_client(args, server.url, requests, {n: i for i, n in enumerate(names)})
    finally:
        server.stop()


def _run_client(
    args, url: str, requests: list[Request], lora_ids: dict[str, int] | None = None
) -> tuple[list[Result], float]:
    """One client, the same for every server: a warm-up, then the timed workload."""
    base = httpx.get(f"{url}/v1/models", timeout=60).json()["data"][0]["id"]
    limits = httpx.Limits(
        max_connections=args.max_concurrency + 8,
        max_keepalive_connections=args.max_concurrency + 8,
    )

    async def go():
        async with httpx.AsyncClient(timeout=None, limits=limits) as client:
            send = http_sender(client, url, base, lora_ids)
            await run_workload(warmup(requests), send, args.max_concurrency)
            return await run_workload(requests, send, args.max_concurrency)

    return asyncio.run(go())


def run_engine(args, config, requests, adapter_dir, names) -> tuple[list[Result], float]:
    engine = AsyncLLMEngine.from_config(config)
    loras = {n: LoRARequest(n, i + 1, str(adapter_dir / n)) for i, n in enumerate(names)}
    try:

        async def go():
            send = engine_sender(engine, loras)
            await run_workload(warmup(requests), send, args.max_concurrency)
            return await run_workload(requests, send, args.max_concurrency)

        return asyncio.run(go())
    finally:
        engine.shutdown()


def warmup(requests: list[Request]) -> list[Request]:
    """A few short requests, one per adapter, so loads and first-call costs are not timed."""
    seen, out = set(), []
    for r in requests:
        if r.adapter not in seen:
            seen.add(r.adapter)
            out.append(Request(r.prompt_ids[:16], 4, r.adapter, 0.0))
    return out


# ---- numbers --------------------------------------------------------------------------------
def main(argv=None) -> dict:
    args = parse_args(argv)
    slo = {k: float(v) for k, v in (item.split(":", 1) for item in args.goodput)}
    result_dir = Path(args.result_dir)
    result_dir.mkdir(parents=True, exist_ok=True)
    hf_dir = resolve_model(args.model).hf_dir
    adapter_dir, names = make_adapters(
        hf_dir, args.num_adapters, args.adapter_rank, args.adapter_targets, args.adapter_dir
    )
    vocab = json.loads((hf_dir / "config.json").read_text())["vocab_size"]
    if args.workload == "long-mix":
        requests = make_long_mix(args, vocab, names)
    else:
        requests = make_workload(args, vocab, names)
    longest = max(len(r.prompt_ids) + r.max_tokens for r in requests)
    args.max_model_len = max(args.max_model_len, -(-longest // 256) * 256)
    config = engine_config(args, adapter_dir)

    raw = {"loragate": run_http(args, config, requests, adapter_dir, result_dir)}
    if args.fixed_budget:  # the same server with a fixed budget, as before stall-free steps
        fixed = replace(config, max_num_batched_tokens=args.fixed_budget)
        raw["loragate-fixed"] = run_http(args, fixed, requests, adapter_dir, result_dir, "fixed")
    if args.also_dequantized:  # the same GGUF served as a float copy (--gguf-dequantize)
        raw["loragate-dequantized"] = run_http(
            args, config, requests, adapter_dir, result_dir, "dequantized", ("--gguf-dequantize",)
        )
    if args.peer == "vllm":
        raw["vllm"] = run_peer(args, config, requests, adapter_dir, names, result_dir)
    if args.peer == "llamacpp":
        raw["llamacpp"] = run_llamacpp(args, config, requests, adapter_dir, names, result_dir)
    if not args.skip_engine:
        raw["engine"] = run_engine(args, config, requests, adapter_dir, names)
    runs = {name: summarize(results, duration, slo) for name, (results, duration) in raw.items()}
    report = {
        "settings": vars(args) | {"request_rate": str(args.request_rate)},
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, torch threads default",
        "load_average_at_end": os.getloadavg(),
        "runs": runs,
    }
    if "engine" in runs:
        report["overhead"] = overhead(runs["loragate"], runs["engine"])
    print(table(runs))
    if "overhead" in report:
        o = report["overhead"]
        print(
            f"\ngateway overhead: {o['throughput_overhead_pct']:.1f}% of output throughput, "
            f"{o['ttft_p50_added_ms']:+.1f} ms p50 TTFT, {o['e2el_p50_added_ms']:+.1f} ms p50 E2E"
        )
    stem = f"serve-{args.workload}-{len(requests)}x{args.max_concurrency}"
    note = f"{report['machine']}; load average at end {os.getloadavg()[0]:.1f}"
    plots = [f"{stem}-latency.png", f"{stem}-itl.png"]
    results_by_run = {name: results for name, (results, _) in raw.items()}
    plot_latency_distributions(results_by_run, result_dir / plots[0], note)
    plot_itl_over_time(raw, result_dir / plots[1], note)
    if args.concurrency_sweep:
        points = run_concurrency_sweep(args, config, requests, adapter_dir, result_dir, slo)
        report["concurrency_sweep"] = points
        print(sweep_table(points))
        plots.append(f"{stem}-concurrency.png")
        plot_throughput_vs_concurrency(points, result_dir / plots[-1], note)
    (result_dir / f"{stem}.json").write_text(json.dumps(report, indent=2, default=str))
    print(f"\nwrote {result_dir / stem}.json and " + ", ".join(plots))
    return report


if __name__ == "__main__":
    main()
