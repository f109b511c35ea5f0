"""Issue 60's fairness workload driven by an outside load generator: guidellm, unchanged,
one process per tenant, each sending with its own tenant key and naming its own adapter,
against `loragate serve` under tenancy. One tenant floods at `--flood-factor` times the
others' rate; the quiet tenants' TTFT (p50, p99, as guidellm measured it) is compared
across the quiet tenants alone, `fcfs` and `fair`, on the same rates, and each tenant's
output tokens per second are reported.

    .venv/bin/python benchmarks/fairness_loadgen.py --seconds 15 --quiet-rate 1

Needs `make loadgen` (guidellm's venv). Name the CPU and the load average with the figures
(printed first): the four guidellm processes run on the same cores as the server.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import httpx
from loadgen_curves import _tool, cpu_info
from loadgen_reports import parse_guidellm
from serve import ServerProcess, engine_config, make_adapters
from serve_args import parse_args as serve_parse_args

from loragate.engine.loading.model_loader import resolve_model

ADMIN_KEY = "fairness-loadgen-admin"
TENANTS = ("flood", "quiet-1", "quiet-2", "quiet-3")


def start(opts, policy: str, adapter_dir: Path, work: Path) -> ServerProcess:
    serve_args = serve_parse_args(
        [
            "--num-adapters",
            str(len(TENANTS)),
            "--max-model-len",
            "512",
            "--max-num-seqs",
            str(opts.max_num_seqs),
        ]
    )
    config = replace(engine_config(serve_args, adapter_dir), scheduling_policy=policy)
    os.environ["LORAGATE_ADMIN_KEY"] = ADMIN_KEY  # the server's tenancy: keys and tenants
    return ServerProcess(config, adapter_dir, work / f"serve-{policy}.log")


def tenants_and_keys(url: str, adapters: list[str]) -> dict[str, tuple[str, str]]:
    """tenant -> (its key, the adapter it names): each adapter public, each tenant its own."""
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    made = {}
    for tenant, adapter in zip(TENANTS, adapters, strict=True):
        got = httpx.post(f"{url}/v1/tenants", json={"name": tenant}, headers=admin, timeout=60)
        got.raise_for_status()
        patched = httpx.patch(
            f"{url}/v1/adapters/{adapter}", json={"public": True}, headers=admin, timeout=60
        )
        patched.raise_for_status()
        made[tenant] = (got.json()["api_key"], adapter)
    for key, adapter in made.values():  # warm: each adapter loaded, first calls not timed
        body = {"model": adapter, "prompt": "Hello there", "max_tokens": 4, "ignore_eos": True}
        httpx.post(
            f"{url}/v1/completions",
            json=body,
            headers={"Authorization": f"Bearer {key}"},
            timeout=300,
        ).raise_for_status()
    return made


def guidellm(opts, url: str, key: str, adapter: str, rate: float, tokenizer, report: Path):
    """One tenant's guidellm run, started (not waited for)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env |= {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9"}
    # One worker process each (guidellm's setting; 10 by default): four guidellm runs of ten
    # polling workers each starve a 2-core server of the cores it serves with.
    env["GUIDELLM__MAX_WORKER_PROCESSES"] = "1"
    args = [
        _tool("guidellm", "guidellm"),
        "run",
        "--backend",
        f"kind=openai_http,target={url},model={adapter},request_format=/v1/completions,"
        f"stream=true,api_key={key}",
        "--profile",
        f"kind=constant,rate={rate:g}",
        "--constraint",
        f"kind=max_duration,seconds={opts.seconds}",
        "--tokenizer",
        f"kind=hf_auto,model={tokenizer}",
        "--data",
        f"kind=synthetic_text,prompt_tokens={opts.input_len},output_tokens={opts.output_len}",
        "--output",
        f"kind=json,path={report}",
        "--disable-console",
    ]
    log = open(report.with_suffix(".log"), "w")  # noqa: SIM115  (closed by the caller)
    return subprocess.Popen([str(a) for a in args], env=env, stdout=log, stderr=log), log


def one_run(opts, policy: str, with_flood: bool, adapter_dir, adapters, tokenizer, work):
    server = start(opts, policy, adapter_dir, work)
    try:
        tenants = tenants_and_keys(server.url, adapters)
        procs = {}
        for tenant, (key, adapter) in tenants.items():
            if tenant == "flood" and not with_flood:
                continue
            rate = opts.quiet_rate * (opts.flood_factor if tenant == "flood" else 1)
            report = work / f"{policy}-{'flood' if with_flood else 'alone'}-{tenant}.json"
            proc, log = guidellm(opts, server.url, key, adapter, rate, tokenizer, report)
            procs[tenant] = (proc, log, report)
        results = {}
        for tenant, (proc, log, report) in procs.items():
            proc.wait(timeout=opts.seconds * 40 + 600)
            log.close()
            if proc.returncode != 0:
                raise RuntimeError(f"guidellm for {tenant} exited {proc.returncode}: {log.name}")
            (point,) = parse_guidellm(json.loads(report.read_text()))
            bench = json.loads(report.read_text())["benchmarks"][0]
            tokens = bench["metrics"]["output_tokens_per_second"]["successful"]["mean"]
            results[tenant] = point | {"output_tok_s": tokens}
        return results
    finally:
        server.stop()


def ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f} ms"


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=15)
    ap.add_argument("--quiet-rate", type=float, default=1.0, help="requests/s of a quiet tenant")
    ap.add_argument("--flood-factor", type=float, default=10)
    ap.add_argument("--input-len", type=int, default=16)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--max-num-seqs", type=int, default=8)
    ap.add_argument("--out", type=Path, help="the JSON result")
    ap.add_argument("--work", type=Path, help="keep the tools' reports and logs here")
    ap.add_argument("--runs", default="alone,fcfs,fair", help="which of alone, fcfs, fair")
    opts = ap.parse_args(argv)
    print(f"# {json.dumps(cpu_info())}", flush=True)
    hf_dir = resolve_model(None).hf_dir
    adapter_dir, adapters = make_adapters(hf_dir, len(TENANTS))
    result = {"options": {k: str(v) for k, v in vars(opts).items()}, "runs": {}}
    with tempfile.TemporaryDirectory() as tmp:
        work = opts.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        chosen = opts.runs.split(",")
        for name, policy, flood in (
            ("alone", "fair", False),
            ("fcfs", "fcfs", True),
            ("fair", "fair", True),
        ):
            if name not in chosen:
                continue
            started = time.monotonic()
            runs = one_run(opts, policy, flood, adapter_dir, adapters, hf_dir, work)
            result["runs"][name] = runs
            print(f"## {name} ({time.monotonic() - started:.0f} s)", flush=True)
            for tenant, p in runs.items():
                print(
                    f"  {tenant}: {p['successful']} ok, {p['errored']} errored, "
                    f"{p['incomplete']} incomplete; TTFT p50 {ms(p['ttft_ms']['p50'])} p99 "
                    f"{ms(p['ttft_ms']['p99'])}; {p['output_tok_s']:.1f} output tok/s",
                    flush=True,
                )
    print(f"# load average after {os.getloadavg()}", flush=True)
    if opts.out:
        opts.out.write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
