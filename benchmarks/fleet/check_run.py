"""The real run the fleet model is checked against: two replicas on Ray Serve, 200
adapters, the model's own workload (benchmarks/fleet/workload.py, same seed, so the model
is given exactly these requests), measured with benchmarks/replicas.py's deployment, runner
and load counts. Writes benchmarks/fleet_check.json (machine, date, load average) and the
ingress overhead into benchmarks/fleet_figures.json.

Before the workload, each deployment answers `--probes` base-model requests one at a time
(no adapter state changes): their median TTFT less the model's step for one 32-token prompt
is the request path's overhead (ingress, Ray Serve, the stream back), a figure the model
takes, not one it is checked on.

    cd benchmarks && ../.venv/bin/python -m fleet.check_run
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch
from replicas import loads, make_adapters, ray_cluster, run_workload
from replicas_round_robin import RoundRobinRouter
from safetensors.torch import load_file, save_file

from loragate.adapters import LoRARequest
from loragate.engine import EngineConfig
from loragate.gateway.replicas.cluster import RayReplicas
from loragate.gateway.settings import GatewaySettings
from loragate.tools.base_model import resolve_base_model

from . import trace
from .figures import FIGURES_JSON, load_figures
from .in_run import figures_of
from .measure import machine
from .trace import TRACE_DIR_ENV
from .workload import Workload

CHECK_JSON = Path(__file__).resolve().parent.parent / "fleet_check.json"
TRACE_JSON = Path(__file__).resolve().parent.parent / "results" / "fleet_check_trace.json"
CONFIGS = [("multiplexed", None, None), ("round-robin", RoundRobinRouter, None), ("spill", None, 2)]


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None)
    p.add_argument("--adapters", type=int, default=200)
    p.add_argument("--num-requests", type=int, default=240)
    p.add_argument("--rate", type=float, default=3.0)
    p.add_argument("--zipf", type=float, default=1.0)
    p.add_argument("--probes", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=CHECK_JSON)
    p.add_argument(
        "--from-trace",
        action="store_true",
        help="no run: recompute each policy's in-run figures of --out from its trace",
    )
    return p.parse_args()


def make_many_adapters(source, root: Path, n: int) -> list[LoRARequest]:
    """`n` rank-8 adapters as benchmarks/replicas.py makes them, quickly: the first through
    PEFT (make_adapters), the others its files with every tensor redrawn at the same scale
    (seeded by the adapter's index), so each has weights, hash and object of its own."""
    (first,) = make_adapters(source, root, 1)
    weights = load_file(Path(first.lora_path) / "adapter_model.safetensors")
    loras = [first]
    for i in range(1, n):
        out = root / f"a{i:02d}"
        out.mkdir()
        shutil.copy(Path(first.lora_path) / "adapter_config.json", out)
        gen = torch.Generator().manual_seed(i)
        save_file(
            {
                k: (torch.randn(t.shape, generator=gen) * t.float().std()).to(t.dtype)
                for k, t in weights.items()
            },
            out / "adapter_model.safetensors",
        )
        loras.append(LoRARequest(f"a{i:02d}", i + 1, str(out)))
    return loras


def refigure(path: Path, trace_path: Path = TRACE_JSON) -> None:
    """Each policy's in-run figures (fleet/in_run.py) from the recorded trace, into `path`."""
    record = json.loads(path.read_text())
    traces = json.loads(trace_path.read_text())
    for name, result in record["results"].items():
        result["in_run"] = figures_of(traces[name])
    path.write_text(json.dumps(record, indent=2) + "\n")


async def load_seconds(engine) -> tuple[tuple[int, float], tuple[int, float]]:
    """(loads, seconds) from disk and into slots, summed over the replicas."""
    rows = [row for r in await engine.replica_reports() for row in r.stats.adapter_loads.values()]
    disk = (sum(row[0] for row in rows), sum(row[1] for row in rows))
    return disk, (sum(row[2] for row in rows), sum(row[3] for row in rows))


def deploy_and_run(settings, router, work, probe, output_len) -> dict:
    replicas = RayReplicas(settings, request_router=router, app_name=f"fleetcheck{time.time_ns()}")
    engine = replicas.start()
    try:

        async def go() -> dict:
            await asyncio.sleep(1.0)  # every replica has reported to the board
            probes = []
            for item in probe:  # one at a time: an idle deployment's request path
                probes.append((await run_workload(engine, [item], output_len))["ttft_p50_s"])
            disk0, slot0, _ = await loads(engine)
            began = time.time()
            result = await run_workload(engine, work, output_len)
            ended = time.time()
            await asyncio.sleep(0.6)  # the last reports are in
            disk1, slot1, shared = await loads(engine)
            disk_s, slot_s = await load_seconds(engine)
            return {
                "disk_loads": disk1 - disk0,
                "slot_loads": slot1 - slot0,
                "adapters_on_both": shared,
                "probe_ttft_median_s": statistics.median(probes),
                # in the run (every load since start, the probes' none): for reference only
                "disk_load_ms_mean": disk_s[1] / max(1, disk_s[0]) * 1e3,
                "slot_load_ms_mean": slot_s[1] / max(1, slot_s[0]) * 1e3,
                "window": [began, ended],
                **result,
            }

        return asyncio.run(go())
    finally:
        replicas.stop()


def main() -> None:
    args = parse_args()
    if args.from_trace:
        refigure(args.out)
        return
    workload = Workload(
        adapters=args.adapters,
        rate=args.rate,
        num_requests=args.num_requests,
        zipf=args.zipf,
        seed=args.seed,
    )
    figures = load_figures()
    cap = figures.capacity
    times, picks = workload.requests()
    rng = random.Random(args.seed)
    prompts = [[rng.randrange(100, 40000) for _ in range(workload.input_len)] for _ in times]
    probe = [
        (0.0, [rng.randrange(100, 40000) for _ in range(workload.input_len)], None)
        for _ in range(args.probes)
    ]
    source = resolve_base_model(args.model)
    load_before = os.getloadavg()
    traces = tempfile.mkdtemp(prefix="fleet-trace-")
    runtime_env = {  # the replicas trace themselves (fleet/trace.py)
        "worker_process_setup_hook": "fleet.trace.install",
        "env_vars": {
            TRACE_DIR_ENV: traces,
            "PYTHONPATH": os.pathsep.join(
                [str(Path(__file__).resolve().parent.parent), os.environ.get("PYTHONPATH", "")]
            ),
        },
    }
    results = {}
    # Ray starts its workers at nice 15, so on a machine shared with other work at nice 0
    # the replicas get almost no CPU (steps of 2-7 s seen at load 10): run them at 0, as
    # the driver and the ingress run.
    with (
        ray_cluster(runtime_env=runtime_env, worker_niceness=0),
        tempfile.TemporaryDirectory() as tmp,
    ):
        loras = make_many_adapters(source, Path(tmp), args.adapters)
        work = [
            (float(t), prompts[i], loras[a])
            for i, (t, a) in enumerate(zip(times, picks, strict=True))
        ]
        engine = EngineConfig(**cap.engine_options(args.model))
        for name, router, spill_at in CONFIGS:
            settings = GatewaySettings(
                engine=engine, replicas=2, replica_cpus=0.5, spill_at=spill_at
            )
            results[name] = deploy_and_run(settings, router, work, probe, workload.output_len)
            print(name, json.dumps(results[name] | {"requests": "..."}), flush=True)
    record = {
        "machine": machine().split(",")[0] + ", 2 cores; 2 replicas of 0.5 CPU on one local Ray",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": "cd benchmarks && ../.venv/bin/python -m fleet.check_run",
        "load_average_before": [round(v, 2) for v in load_before],
        "load_average_after": [round(v, 2) for v in os.getloadavg()],
        "model": source.name,
        "workload": vars(workload),
        "capacity": vars(cap),
        "spill_at": 2,
        "results": results,
    }
    events = trace.read(Path(traces))
    kept = {}
    for name, result in results.items():
        began, ended = result["window"]
        kept[name] = {"client": result.pop("requests")} | {
            kind: [
                e for e in rows if began <= e.get("t", e.get("start", e.get("arrived"))) <= ended
            ]
            for kind, rows in events.items()
        }
        result["in_run"] = figures_of(kept[name])
    TRACE_JSON.parent.mkdir(parents=True, exist_ok=True)
    TRACE_JSON.write_text(json.dumps(kept))
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    probe_s = statistics.median(r["probe_ttft_median_s"] for r in results.values())
    data = json.loads(FIGURES_JSON.read_text())
    data["overhead_ms"] = round(probe_s * 1e3 - figures.step.ms(workload.input_len, 0, 0), 1)
    data["source"]["overhead_ms"] = (
        f"check_run: median base-model TTFT on an idle deployment {probe_s * 1e3:.1f} ms "
        "less the fitted step for one prompt"
    )
    FIGURES_JSON.write_text(json.dumps(data, indent=2) + "\n")
    print(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
