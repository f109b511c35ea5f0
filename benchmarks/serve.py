"""Online serving benchmark, shaped like `vllm bench serve`, plus the gateway's own overhead.

One seeded workload (random-token prompts and output lengths, Poisson or gamma arrivals at
--request-rate, at most --max-concurrency in flight, adapters drawn by power-law
popularity) runs twice in one invocation:

  http    streamed through the HTTP gateway (`loragate serve` in a subprocess by default),
          the way a client sees it: POST /v1/completions with stream=true;
  engine  the same requests, same arrival times, straight into AsyncLLMEngine in this
          process: no HTTP, no JSON, no SSE.

The difference is the gateway's overhead. Reports request and token throughput, TTFT, TPOT,
ITL and E2E latency (mean, p50, p99) and goodput under an SLO, as a table, a JSON file and
a PNG plot (latency CDFs; written without plotting libraries).

    .venv/bin/python benchmarks/serve.py --num-prompts 128 --max-concurrency 64

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
import struct
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np

from loragate.adapters import LoRARequest
from loragate.engine import EngineConfig, SamplingParams
from loragate.engine.async_engine import AsyncLLMEngine
from loragate.engine.model_loader import resolve_model
from loragate.tools import make_random_adapter

ADAPTER_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]


# ---- the workload ---------------------------------------------------------------------------
@dataclass
class Request:
    prompt_ids: list[int]
    max_tokens: int
    adapter: str | None
    arrival: float  # seconds after the start


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


async def run_workload(requests: list[Request], send, max_concurrency: int):
    """Send each request at its arrival time (bounded by max_concurrency); time the run."""
    limit = asyncio.Semaphore(max_concurrency)
    start = time.perf_counter()

    async def one(request: Request) -> Result:
        delay = request.arrival - (time.perf_counter() - start)
        if delay > 0:
            await asyncio.sleep(delay)
        async with limit:
            try:
                return await send(request)
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
    )


def http_sender(client: httpx.AsyncClient, url: str, base_model: str):
    async def send(request: Request) -> Result:
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
        if usage is None or not token_times:
            return Result(ok=False, error="stream ended without usage or tokens")
        return _timed(token_times, sent, usage["prompt_tokens"], usage["completion_tokens"])

    return send


def engine_sender(engine: AsyncLLMEngine, loras: dict[str, LoRARequest]):
    ids = iter(range(1 << 62))

    async def send(request: Request) -> Result:
        params = SamplingParams(temperature=0.0, max_tokens=request.max_tokens, ignore_eos=True)
        lora = loras[request.adapter] if request.adapter else None
        sent = time.perf_counter()
        token_times, seen, out = [], 0, None
        prompt = {"prompt_token_ids": request.prompt_ids}
        async for out in engine.generate(prompt, params, f"bench-{next(ids)}", lora_request=lora):
            n = len(out.outputs[0].token_ids)
            if n > seen:
                token_times.append(time.perf_counter())
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
            "--max-num-batched-tokens", str(config.max_num_batched_tokens),
            "--kv-cache-memory-gb", str(config.kv_cache_memory_gb),
            "--max-loras", str(config.max_loras), "--max-lora-rank", str(config.max_lora_rank),
            "--max-cpu-loras", str(config.max_cpu_loras),
        ] + (["--model", config.model] if config.model else []) + list(extra_args)  # fmt: skip
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


def run_http(args, config, requests, adapter_dir, result_dir) -> tuple[list[Result], float]:
    server = ServerProcess(config, adapter_dir, result_dir / "serve_server.log")
    try:
        base = httpx.get(f"{server.url}/v1/models", timeout=60).json()["data"][0]["id"]
        limits = httpx.Limits(
            max_connections=args.max_concurrency + 8,
            max_keepalive_connections=args.max_concurrency + 8,
        )

        async def go():
            async with httpx.AsyncClient(timeout=None, limits=limits) as client:
                send = http_sender(client, server.url, base)
                await run_workload(warmup(requests), send, args.max_concurrency)
                return await run_workload(requests, send, args.max_concurrency)

        return asyncio.run(go())
    finally:
        server.stop()


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


def _stats_ms(name: str, values: list[float]) -> dict:
    if not values:
        return {f"{name}_{k}_ms": float("nan") for k in ("mean", "p50", "p99")}
    ms = np.asarray(values) * 1e3
    return {
        f"{name}_mean_ms": float(ms.mean()),
        f"{name}_p50_ms": float(np.percentile(ms, 50)),
        f"{name}_p99_ms": float(np.percentile(ms, 99)),
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
    for stat in ("mean", "p50", "p99")
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


# ---- a PNG without plotting libraries ----------------------------------------------------------
# 3x5 bitmap glyphs, one row of three pixels per digit, top to bottom.
_GLYPHS = {
    "0": "75557", "1": "26227", "2": "71747", "3": "71317", "4": "55711",
    "5": "74717", "6": "74757", "7": "71111", "8": "75757", "9": "75717", ".": "00002",
    "-": "00700", " ": "00000", "%": "51245", "/": "11244", "(": "24442", ")": "42224",
    ":": "02020", "A": "25755", "B": "65656", "C": "74447", "D": "65556", "E": "74647",
    "F": "74644", "G": "74557", "H": "55755", "I": "72227", "J": "11157", "K": "55655",
    "L": "44447", "M": "57555", "N": "75555", "O": "75557", "P": "75744", "Q": "75573",
    "R": "75765", "S": "74717", "T": "72222", "U": "55557", "V": "55552", "W": "55575",
    "X": "55255", "Y": "55222", "Z": "71247",
}  # fmt: skip
COLORS = {"http": (31, 119, 180), "engine": (255, 127, 14)}


class Canvas:
    def __init__(self, width: int, height: int):
        self.px = np.full((height, width, 3), 255, dtype=np.uint8)

    def rect(self, x0, y0, x1, y1, color):
        self.px[max(0, y0) : y1, max(0, x0) : x1] = color

    def line(self, x0, y0, x1, y1, color, width=2):
        steps = int(max(abs(x1 - x0), abs(y1 - y0), 1))
        for t in np.linspace(0.0, 1.0, steps + 1):
            x, y = round(x0 + (x1 - x0) * t), round(y0 + (y1 - y0) * t)
            self.rect(
                x - width // 2, y - width // 2, x + (width + 1) // 2, y + (width + 1) // 2, color
            )

    def text(self, x, y, s, color=(0, 0, 0), scale=2):
        for ch in s.upper():
            rows = _GLYPHS.get(ch, _GLYPHS[" "])
            for r, bits in enumerate(rows):
                for c in range(3):
                    if int(bits) >> (2 - c) & 1:
                        self.rect(
                            x + c * scale,
                            y + r * scale,
                            x + (c + 1) * scale,
                            y + (r + 1) * scale,
                            color,
                        )
            x += 4 * scale

    def save(self, path: Path) -> None:
        height, width, _ = self.px.shape
        raw = b"".join(b"\x00" + self.px[y].tobytes() for y in range(height))

        def chunk(kind: bytes, data: bytes) -> bytes:
            return (
                struct.pack(">I", len(data))
                + kind
                + data
                + struct.pack(">I", zlib.crc32(kind + data))
            )

        header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
        path.write_bytes(
            b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 9))
            + chunk(b"IEND", b"")
        )  # fmt: skip


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
    p.add_argument("--num-prompts", type=int, default=128)
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
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument("--max-loras", type=int, default=4)
    p.add_argument("--kv-cache-memory-gb", type=float, default=1.0)
    p.add_argument("--skip-engine", action="store_true", help="only the HTTP run")
    p.add_argument("--result-dir", default="benchmarks/results")
    return p.parse_args(argv)


def main(argv=None) -> dict:
    args = parse_args(argv)
    slo = {k: float(v) for k, v in (item.split(":", 1) for item in args.goodput)}
    result_dir = Path(args.result_dir)
    result_dir.mkdir(parents=True, exist_ok=True)
    hf_dir = resolve_model(args.model).hf_dir
    adapter_dir, names = make_adapters(args, hf_dir)
    config = engine_config(args, adapter_dir)
    vocab = json.loads((hf_dir / "config.json").read_text())["vocab_size"]
    requests = make_workload(args, vocab, names)

    raw = {"http": run_http(args, config, requests, adapter_dir, result_dir)}
    if not args.skip_engine:
        raw["engine"] = run_engine(args, config, requests, adapter_dir, names)
    runs = {name: summarize(results, duration, slo) for name, (results, duration) in raw.items()}
    report = {
        "settings": vars(args) | {"request_rate": str(args.request_rate)},
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, torch threads default",
        "runs": runs,
    }
    if "engine" in runs:
        report["overhead"] = overhead(runs["http"], runs["engine"])
    print(table(runs))
    if "overhead" in report:
        o = report["overhead"]
        print(
            f"\ngateway overhead: {o['throughput_overhead_pct']:.1f}% of output throughput, "
            f"{o['ttft_p50_added_ms']:+.1f} ms p50 TTFT, {o['e2el_p50_added_ms']:+.1f} ms p50 E2E"
        )
    stem = f"serve-{args.num_prompts}x{args.max_concurrency}"
    (result_dir / f"{stem}.json").write_text(json.dumps(report, indent=2, default=str))
    plot_cdfs({name: results for name, (results, _) in raw.items()}, result_dir / f"{stem}.png")
    print(f"\nwrote {result_dir / stem}.json and .png")
    return report


if __name__ == "__main__":
    main()
