"""Serving curves drawn by the load generators users run (issue 62): guidellm's rate sweep and
an inference-perf run with a LoRA traffic split, against `loragate serve` and against vLLM-CPU's
OpenAI api_server on the same machine, one server at a time, with the same 16 adapters.

Each server (the default model; 16 random rank-8 PEFT adapters on q/k/v/o made as
benchmarks/serve.py makes them, registered from --adapter-root on loragate and with
--lora-modules on vLLM) gets, after one short request per adapter to warm it:

  1. guidellm (its own venv, `make loadgen`), unchanged: `--profile kind=sweep`
     (synchronous, then throughput at saturation, then constant rates between the two),
     streamed /v1/completions, naming the adapter in its backend's `model`. guidellm
     sends one `model` for a whole run (no per-request model), so the sweep names one
     adapter with all 16 loaded; the traffic spread over the 16 is inference-perf's part;
  2. inference-perf, unchanged: constant-rate stages at fractions of the rate guidellm's
     throughput point reached, with `load.lora_traffic_split` spread evenly over the 16
     adapters (it checks them against /v1/models).

Each tool's own report is parsed (guidellm's JSON, inference-perf's per-stage
lifecycle reports): TTFT and ITL p50/p99 against the request rate it achieved. The knee is
the highest achieved rate whose P99 TTFT stays at or under --knee-ttft-ms; issue 62's goal
is loragate's knee at >= 1.5x vLLM-CPU's. Writes loadgen-curves-<date>.json and two plots
(TTFT and ITL against rate, both servers side by side, the knee marked) into --out.

    .venv/bin/python benchmarks/loadgen_curves.py            # the whole run, ~25 minutes
    .venv/bin/python benchmarks/loadgen_curves.py --quick    # a smoke run, loragate only
    .venv/bin/python benchmarks/loadgen_curves.py --rates 0.1,0.2,0.4   # fixed rates instead

guidellm's sweep places its constant rates between the synchronous and the throughput
points' rates; where the throughput point completes fewer requests per second than the
synchronous one (a loaded machine: requests left in flight when its time ends are not
counted), the sweep never passes the synchronous rate, and `--rates` gives both servers the
same fixed rates instead.

Both servers run on all cores (loragate's torch threads default to them; vLLM-CPU binds its
OpenMP threads to 0..N-1), in float32 activations; the load generators run on the same
cores, as they would beside a small server.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx
import yaml
from loadgen_reports import knees, parse_guidellm, parse_inference_perf, plot_curves, table
from serve import ServerProcess, engine_config, make_adapters
from serve_args import parse_args as serve_parse_args
from serve_peer import VLLMServer, peer_python

from loragate.engine.loading.model_loader import resolve_model

REPO = Path(__file__).resolve().parent.parent
LOADGEN = REPO / ".loadgen"
KNEE_TTFT_MS = 2000.0
EXTRA_THRESHOLDS_MS = (500.0, 1000.0, 2000.0, 5000.0)


# ---- running the tools ----------------------------------------------------------------------
def _tool(tool: str, command: str) -> Path:
    path = LOADGEN / tool / "bin" / command
    if not (LOADGEN / tool / ".installed").exists():
        sys.exit(f"{tool} is not installed under {LOADGEN}: run `make loadgen`")
    return path


def _run(args: list, cwd: Path, log: Path, timeout: float) -> None:
    """A tool's CLI in its own venv, offline (every tokenizer is a local folder)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env |= {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9"}
    # guidellm's own setting, ten worker processes by default: on the server's two cores
    # they take the CPU the server needs (inference-perf runs one worker already).
    env["GUIDELLM__MAX_WORKER_PROCESSES"] = "1"
    with open(log, "w") as out:
        done = subprocess.run(
            [str(a) for a in args],
            cwd=cwd,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=timeout,
            check=False,
        )
    if done.returncode != 0:
        tail = log.read_text()[-3000:]
        raise RuntimeError(f"{Path(str(args[0])).name} exited {done.returncode}:\n{tail}")


def warm(url: str, adapters: list[str]) -> str:
    """One short request per adapter (loads and first calls are not timed); the base's name."""
    models = httpx.get(f"{url}/v1/models", timeout=60).json()["data"]
    base = next(m["id"] for m in models if m.get("parent") is None)
    for name in adapters:
        body = {"model": name, "prompt": "Hello there", "max_tokens": 4, "ignore_eos": True}
        httpx.post(f"{url}/v1/completions", json=body, timeout=300).raise_for_status()
    return base


def run_guidellm(opts, url: str, adapter: str, tokenizer: Path, work: Path) -> list[dict]:
    report = work / "guidellm.json"
    if opts.rates:  # constant rates, one benchmark each, as guidellm's docs show
        profile = [
            "--profile",
            f"kind=constant,rate={opts.rates[0]},max_concurrency={opts.max_concurrency}",
            "--override",
            "profile.rate",
            ",".join(f"{r:g}" for r in opts.rates),
        ]
        points = len(opts.rates)
    else:  # synchronous, throughput, then constant rates between their two rates
        profile = [
            "--profile",
            f"kind=sweep,sweep_size={opts.sweep_size},max_concurrency={opts.max_concurrency}",
        ]
        points = opts.sweep_size
    _run(
        [
            _tool("guidellm", "guidellm"),
            "run",
            "--backend",
            f"kind=openai_http,target={url},model={adapter},"
            "request_format=/v1/completions,stream=true",
            *profile,
            "--constraint",
            f"kind=max_duration,seconds={opts.seconds}",
            "--tokenizer",
            f"kind=hf_auto,model={tokenizer}",
            "--data",
            f"kind=synthetic_text,prompt_tokens={opts.prompt_tokens},"
            f"output_tokens={opts.output_tokens}",
            "--output",
            f"kind=json,path={report}",
            "--disable-console",
        ],
        work,
        work / "guidellm.log",
        timeout=points * (opts.seconds + 150) + 120,
    )
    return parse_guidellm(json.loads(report.read_text()))


def inference_perf_config(opts, url, base, adapters, tokenizer, rates, reports) -> dict:
    n = opts.prompt_tokens
    m = opts.output_tokens
    return {
        "api": {"type": "completion", "streaming": True},
        "data": {
            "type": "random",
            "input_distribution": {"min": n, "max": n, "mean": n, "std_dev": 0},
            "output_distribution": {"min": m, "max": m, "mean": m, "std_dev": 0},
        },
        "load": {
            "type": "constant",
            "stages": [{"rate": round(r, 3), "duration": opts.ip_seconds} for r in rates],
            "num_workers": 1,
            "base_seed": 62,
            "stage_teardown_grace_seconds": 60,
            "lora_traffic_split": [{"name": a, "split": 1 / len(adapters)} for a in adapters],
        },
        "server": {"type": "vllm", "model_name": base, "base_url": url, "ignore_eos": True},
        "tokenizer": {"pretrained_model_name_or_path": str(tokenizer)},
        "storage": {"local_storage": {"path": str(reports)}},
        "report": {"request_lifecycle": {"summary": True, "per_stage": True, "per_adapter": True}},
    }


def run_inference_perf(opts, url, base, adapters, tokenizer, rates, work: Path) -> list[dict]:
    reports = work / "inference-perf"
    config = inference_perf_config(opts, url, base, adapters, tokenizer, rates, reports)
    (work / "inference-perf.yml").write_text(yaml.safe_dump(config))
    _run(
        [_tool("inference-perf", "inference-perf"), "--config_file", work / "inference-perf.yml"],
        work,
        work / "inference-perf.log",
        timeout=len(rates) * (opts.ip_seconds + 90) + 180,
    )
    return parse_inference_perf(reports)


def stage_rates(guidellm_points: list[dict], fractions) -> list[float]:
    """inference-perf's stage rates: fractions of the highest rate guidellm's sweep reached."""
    top = max((p["rate"] for p in guidellm_points), default=0.0)
    return [max(top * f, 0.01) for f in fractions]


# ---- one server -----------------------------------------------------------------------------
def bench_server(name: str, opts, adapter_dir: Path, adapters: list[str], tokenizer: Path):
    work = Path(opts.work) / name
    work.mkdir(parents=True, exist_ok=True)
    serve_args = serve_parse_args(
        [
            "--num-adapters",
            str(len(adapters)),
            "--max-model-len",
            "512",
            "--max-num-seqs",
            str(opts.max_num_seqs),
            "--dtype",
            "float32",
        ]
    )
    started = time.monotonic()
    if name.startswith("loragate"):
        # loragate-f32: the default model's GGUF dequantized to float32 weights, as vLLM-CPU
        # is given them (loragate serves the file's Q4_1/Q8_0 blocks by default)
        extra = ("--gguf-dequantize",) if name == "loragate-f32" else ()
        server = ServerProcess(
            engine_config(serve_args, adapter_dir), adapter_dir, work / "serve.log", extra
        )
    else:
        server = VLLMServer(
            peer_python(),
            adapter_dir,
            adapters,
            max_num_seqs=opts.max_num_seqs,
            max_model_len=512,
            max_lora_rank=8,
            log_path=work / "serve.log",
        )
    try:
        print(f"{name}: up in {time.monotonic() - started:.0f} s at {server.url}", flush=True)
        models = httpx.get(f"{server.url}/v1/models", timeout=60).json()["data"]
        cards = {m["id"]: {k: m.get(k) for k in ("root", "parent")} for m in models}
        base = warm(server.url, adapters)
        print(f"{name}: warm; guidellm sweep", flush=True)
        sweep = run_guidellm(opts, server.url, adapters[0], tokenizer, work)
        for p in sweep:
            print(
                f"  guidellm {p['strategy']}: {p['rate']:.2f} req/s, TTFT p99 "
                f"{p['ttft_ms']['p99']} ms",
                flush=True,
            )
        rates = stage_rates(sweep, opts.ip_fractions)
        print(f"{name}: inference-perf at {[round(r, 3) for r in rates]} req/s", flush=True)
        split = run_inference_perf(opts, server.url, base, adapters, tokenizer, rates, work)
        for p in split:
            print(
                f"  inference-perf stage {p['stage']}: {p['rate']:.2f} req/s, TTFT p99 "
                f"{p['ttft_ms']['p99']} ms",
                flush=True,
            )
    finally:
        server.stop()
    return {"models": cards, "guidellm": sweep, "inference_perf": split}


def cpu_info() -> dict:
    model, flags = platform.processor() or platform.machine(), []
    try:
        text = Path("/proc/cpuinfo").read_text()
        model = next(
            x.split(":", 1)[1].strip() for x in text.splitlines() if x.startswith("model name")
        )
        flags = next(x.split(":", 1)[1].split() for x in text.splitlines() if x.startswith("flags"))
    except (OSError, StopIteration):
        pass
    wanted = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "fma")
    return {"model": model, "flags": [f for f in wanted if f in flags], "cpus": os.cpu_count()}


def options(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="smoke run: 4 adapters, short stages")
    p.add_argument(
        "--servers",
        default=None,
        help="of loragate, loragate-f32 (--gguf-dequantize), vllm; default: loragate,vllm",
    )
    p.add_argument("--num-adapters", type=int, default=16)
    p.add_argument("--prompt-tokens", type=int, default=32)
    p.add_argument("--output-tokens", type=int, default=16)
    p.add_argument("--sweep-size", type=int, default=6, help="guidellm: sync + throughput + N-2")
    p.add_argument(
        "--rates",
        type=lambda v: [float(x) for x in v.split(",")],
        default=None,
        help="guidellm: these constant rates (req/s) instead of its sweep, the same for both",
    )
    p.add_argument("--seconds", type=float, default=30, help="guidellm: each sweep point")
    p.add_argument("--max-concurrency", type=int, default=32, help="guidellm's throughput point")
    p.add_argument("--max-num-seqs", type=int, default=32, help="both servers' batch")
    p.add_argument(
        "--ip-fractions",
        type=lambda v: [float(x) for x in v.split(",")],
        default=[0.3, 0.6, 0.9],
        help="inference-perf's stage rates, as fractions of guidellm's highest rate",
    )
    p.add_argument("--ip-seconds", type=int, default=30, help="inference-perf: each stage")
    p.add_argument("--knee-ttft-ms", type=float, default=KNEE_TTFT_MS)
    p.add_argument("--adapter-dir", default=None, help="where the random adapters are kept")
    p.add_argument("--work", default=str(Path(tempfile.gettempdir()) / "loragate-loadgen-curves"))
    p.add_argument("--out", default=str(REPO / "docs" / "benchmarks"))
    opts = p.parse_args(argv)
    if opts.quick:
        opts.num_adapters, opts.sweep_size, opts.seconds = 4, 3, 10
        opts.ip_fractions, opts.ip_seconds = [0.5], 10
        opts.servers = opts.servers or "loragate"
    opts.servers = (opts.servers or ("loragate,vllm" if peer_python() else "loragate")).split(",")
    return opts


def main(argv=None) -> dict:
    opts = options(argv)
    hf_dir = resolve_model(None).hf_dir
    adapter_dir, adapters = make_adapters(hf_dir, opts.num_adapters, adapter_dir=opts.adapter_dir)
    started = datetime.now(UTC)
    load_before = os.getloadavg()
    runs = {name: bench_server(name, opts, adapter_dir, adapters, hf_dir) for name in opts.servers}
    thresholds = sorted({opts.knee_ttft_ms, *EXTRA_THRESHOLDS_MS})
    curves = {
        tool: {n: r[tool] for n, r in runs.items()} for tool in ("guidellm", "inference_perf")
    }
    result = {
        "issue": 62,
        "started": started.isoformat(timespec="seconds"),
        "finished": datetime.now(UTC).isoformat(timespec="seconds"),
        "cpu": cpu_info(),
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "settings": {k: v for k, v in vars(opts).items() if k not in ("work", "out")},
        "knee_ttft_p99_ms": opts.knee_ttft_ms,
        "runs": runs,
        "knees": {tool: knees(c, thresholds) for tool, c in curves.items()},
    }
    goal = result["knees"]["guidellm"][f"{opts.knee_ttft_ms:g}"]["ratio"]
    result["goal_met"] = None if goal is None else goal >= 1.5
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"loadgen-curves-{started.date()}" + ("-rates" if opts.rates else "-sweep")
    stem += "-quick" if opts.quick else ""
    note = (
        f"{result['cpu']['model']}, {result['cpu']['cpus']} CPUs; load average "
        f"{load_before[0]:.1f} before, {result['load_average_after'][0]:.1f} after; "
        f"{opts.prompt_tokens} prompt / {opts.output_tokens} output tokens"
    )
    for tool, c in curves.items():
        plot_curves(
            tool,
            c,
            opts.knee_ttft_ms,
            out / f"{stem}-{tool.replace('_', '-')}.png",
            note,
            len(adapters),
        )
    (out / f"{stem}.json").write_text(json.dumps(result, indent=2))
    print(table(result))
    print(f"wrote {out / stem}.json and its two plots")
    return result


if __name__ == "__main__":
    main()
