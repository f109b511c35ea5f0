"""Uploading an adapter and its first token: cold (store to slot) against warm (issue 37).

Two `loragate serve` processes on the default model share one Redis registry and one adapter
store (moto's S3 server, started here, or a local directory with --store local), each with
its own cache directory. For each of --repeats fresh rank-16 adapters on all seven
projections:
  upload        POST /v1/adapters (multipart) to gateway A: stream, hash, validate, store,
                load into A's CPU tier, register
  upload again  the same bytes under a second name (stored once: nothing new to write)
  TTFT A first  A's first request (weights in its CPU tier since the upload: CPU -> slot)
  TTFT B cold   B has never seen the adapter: store -> its cache (fetch, hash check) -> CPU
                tier -> device slot -> prefill
  TTFT B warm   B's next request (weights in a slot)
and the base model's TTFT on B for reference. Time to first token is the time to the first
streamed chunk of a streamed completion (about 30 prompt tokens, max_tokens 8, greedy).

    .venv/bin/python benchmarks/adapter_upload.py --repeats 5
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx
from server_process import free_port

from loragate.tools import make_random_adapter
from loragate.tools.base_model import load_hf_model, resolve_base_model

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
ADMIN = "bench-admin-key-0123456789"
PROMPT = "The quick brown fox jumps over the lazy dog. " * 3


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--store", choices=["s3", "local"], default="s3")
    p.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    return p.parse_args()


def wait_http(url: str, proc: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{proc.args[0]} exited with {proc.returncode}")
        try:
            httpx.get(url, timeout=2)
            return
        except httpx.HTTPError:
            time.sleep(0.2)
    raise SystemExit(f"{url} did not answer")


def serve(port: int, store: str, cache: Path, namespace: str, redis_url: str, env: dict):
    args = [sys.executable, "-m", "loragate.gateway.assembly.cli", "serve"]
    args += ["--port", str(port), "--admin-key", ADMIN, "--redis-url", redis_url]
    args += ["--redis-namespace", namespace, "--adapter-store", store]
    args += ["--adapter-cache-dir", str(cache), "--max-lora-rank", "16"]
    proc = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_http(f"http://127.0.0.1:{port}/health", proc)
    return proc


def upload(url: str, name: str, folder: Path) -> float:
    began = time.perf_counter()
    with (
        open(folder / "adapter_config.json", "rb") as config,
        open(folder / "adapter_model.safetensors", "rb") as weights,
    ):
        got = httpx.post(
            f"{url}/v1/adapters",
            headers={"Authorization": f"Bearer {ADMIN}"},
            data={"name": name},
            files={"adapter_config.json": config, "adapter_model.safetensors": weights},
            timeout=600,
        )
    elapsed = time.perf_counter() - began
    got.raise_for_status()
    return elapsed


def ttft(url: str, model: str) -> float:
    body = {"model": model, "prompt": PROMPT, "max_tokens": 8, "temperature": 0, "stream": True}
    began = time.perf_counter()
    headers = {"Authorization": f"Bearer {ADMIN}"}
    with httpx.stream(
        "POST", f"{url}/v1/completions", json=body, headers=headers, timeout=600
    ) as r:
        r.raise_for_status()
        lines = r.iter_lines()
        for line in lines:
            if line.startswith("data: ") and '"text"' in line:
                first = time.perf_counter() - began
                for _ in lines:  # the rest, so the request ends before the next one
                    pass
                return first
    raise RuntimeError("no token streamed")


def start_moto():
    """moto's S3 server on a free port, a bucket, and the environment boto3 reads."""
    import boto3

    port = free_port()
    moto = Path(sys.executable).with_name("moto_server")
    proc = subprocess.Popen(
        [str(moto), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    wait_http(endpoint, proc)
    env = {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "bench",
        "AWS_SECRET_ACCESS_KEY": "bench",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    bucket = f"bench-{uuid.uuid4().hex[:8]}"
    boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id="bench",
        aws_secret_access_key="bench",
        region_name="us-east-1",
    ).create_bucket(Bucket=bucket)
    return proc, env, bucket


def main() -> None:
    args = parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-upload-"))
    env = dict(os.environ)
    procs = []
    if args.store == "s3":
        moto, env_s3, bucket = start_moto()
        procs.append(moto)
        env.update(env_s3)
        store = f"s3://{bucket}/adapters"
    else:
        store = str(work / "store")
    namespace = f"bench-upload-{uuid.uuid4().hex[:8]}"
    source = resolve_base_model(None)
    base = load_hf_model(source.hf_dir)
    folders = [
        make_random_adapter(
            base,
            work / f"a{i}",
            rank=args.rank,
            targets=TARGETS,
            seed=100 + i,
            base_model_name=source.name,
        )
        for i in range(args.repeats)
    ]
    size = (folders[0] / "adapter_model.safetensors").stat().st_size
    load_before = os.getloadavg()
    ports = free_port(), free_port()
    a_url, b_url = (f"http://127.0.0.1:{p}" for p in ports)
    kinds = ("upload", "upload_again", "a_first", "b_cold", "b_warm", "base")
    rows: dict[str, list[float]] = {k: [] for k in kinds}
    try:
        procs.append(serve(ports[0], store, work / "cache-a", namespace, args.redis_url, env))
        procs.append(serve(ports[1], store, work / "cache-b", namespace, args.redis_url, env))
        models = httpx.get(f"{b_url}/v1/models", headers={"Authorization": f"Bearer {ADMIN}"})
        base_model = models.json()["data"][0]["id"]
        ttft(b_url, base_model)  # warm-up
        for i, folder in enumerate(folders):
            rows["upload"].append(upload(a_url, f"r{i}", folder))
            rows["upload_again"].append(upload(a_url, f"r{i}-again", folder))
            rows["a_first"].append(ttft(a_url, f"r{i}"))
            time.sleep(0.5)  # B hears of the registration (it does within a second)
            rows["b_cold"].append(ttft(b_url, f"r{i}"))
            rows["b_warm"].append(ttft(b_url, f"r{i}"))
            rows["base"].append(ttft(b_url, base_model))
    finally:
        for proc in reversed(procs):
            proc.terminate()
            proc.wait(timeout=30)
        import redis

        client = redis.Redis.from_url(args.redis_url)
        for key in client.scan_iter(f"{namespace}:*"):
            client.delete(key)
    fetched = [p for p in (work / "cache-b").iterdir() if not p.name.startswith(".")]
    assert len(fetched) == args.repeats, f"gateway B fetched {len(fetched)} objects"
    report = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
        "store": args.store,
        "adapter": f"rank {args.rank}, {len(TARGETS)} projections, {size / 1e6:.1f} MB",
        "repeats": args.repeats,
        "objects_fetched_by_b": len(fetched),
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "median_seconds": {k: round(statistics.median(v), 3) for k, v in rows.items()},
        "all_seconds": {k: [round(x, 3) for x in v] for k, v in rows.items()},
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
