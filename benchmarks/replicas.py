"""Engine replicas on Ray Serve: adapter-affinity (multiplexed) routing against plain round
robin over the same number of replicas, and 1 replica against 2, in one run.

16 adapters with power-law popularity (adapter i drawn with weight 1/(i+1)^alpha), Poisson
arrivals, random-token prompts, `ignore_eos` outputs of a fixed length. Each configuration
deploys its own replicas on one local Ray cluster and runs the same seeded workload through
the ReplicatedEngine (the ingress's engine; no HTTP, so only routing and the replicas
differ). Reports adapter loads (from files, and into device slots, summed over the replicas),
TTFT p50/p99, end-to-end p50 and output-token throughput.

    .venv/bin/python benchmarks/replicas.py --num-requests 96 --rate 3
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

import ray
from harness import machine_line, percentile, print_table, random_adapters
from ray import serve
from replicas_round_robin import RoundRobinRouter

from loragate.adapters import LoRARequest
from loragate.engine import EngineConfig, SamplingParams
from loragate.gateway.replicas.cluster import RayReplicas
from loragate.gateway.settings import GatewaySettings
from loragate.tools.base_model import resolve_base_model

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="HF dir or .gguf; default: the default model")
    p.add_argument("--num-adapters", type=int, default=16)
    p.add_argument("--slots", type=int, default=4, help="max_loras of each replica")
    p.add_argument("--num-requests", type=int, default=96)
    p.add_argument("--rate", type=float, default=3.0, help="requests per second (Poisson)")
    p.add_argument("--input-len", type=int, default=32)
    p.add_argument("--output-len", type=int, default=16)
    p.add_argument("--alpha", type=float, default=1.0, help="power-law exponent")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/replicas.json"))
    return p.parse_args()


def make_adapters(source, root: Path, n: int) -> list[LoRARequest]:
    """`n` rank-8 adapters on the attention projections, named a00, a01, ..."""
    paths = random_adapters(root, n, rank=8, targets=TARGETS, source=source)
    return [LoRARequest(f"a{i:02d}", i + 1, str(path)) for i, path in enumerate(paths)]


def engine_config(args) -> EngineConfig:
    """Each replica's engine: `--slots` device slots, twice as many in the CPU tier."""
    return EngineConfig(
        model=args.model,
        enable_lora=True,
        max_loras=args.slots,
        max_cpu_loras=args.slots * 2,
        max_lora_rank=8,
        num_kv_blocks=1024,
        max_model_len=512,
    )


@contextlib.contextmanager
def ray_cluster(
    nodes: int = 0, runtime_env: dict | None = None, worker_niceness: int | None = None
):
    """Ray joined for the run: (the head's address, an S3 adapter store's URI). With
    `nodes` 0, one local Ray of its own and no store, its workers started with `runtime_env`
    and at `worker_niceness` (None: Ray's own, nice 15); else a multi-node Ray cluster on
    this machine (a head with no CPUs, `nodes` workers of one CPU each, at nice 0) and moto's
    S3 server."""
    if not nodes:
        if worker_niceness is not None:
            os.environ.setdefault("RAY_worker_niceness", str(worker_niceness))
        ray.init(
            address="local",  # a Ray of its own, never another session's running one
            num_cpus=2,
            include_dashboard=False,
            log_to_driver=False,
            object_store_memory=128 * 1024 * 1024,
            namespace="loragate",
            runtime_env=runtime_env,
        )
        try:
            yield None, None
        finally:
            serve.shutdown()
            ray.shutdown()
        return
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from ray.cluster_utils import Cluster
    from s3_testlib import environment, s3_server

    store = 96 * 1024 * 1024
    # Ray starts workers at nice 15: on a machine shared with other work the replicas would
    # get almost no CPU. At 0 they take their share, as the driver does.
    os.environ.setdefault("RAY_worker_niceness", "0")
    with s3_server() as s3, environment(s3.env):  # the env reaches every raylet
        cluster = Cluster(
            initialize_head=True, head_node_args={"num_cpus": 0, "object_store_memory": store}
        )
        for _ in range(nodes):
            cluster.add_node(num_cpus=1, object_store_memory=store)
        cluster.wait_for_nodes()
        try:
            ray.init(address=cluster.address, namespace="loragate", log_to_driver=False)
            yield cluster.address, f"s3://{s3.new_bucket()}/adapters"
        finally:
            serve.shutdown()
            ray.shutdown()
            cluster.shutdown()


def arrivals(args, pick) -> list[tuple[float, list[int], LoRARequest]]:
    """(arrival, prompt, adapter) triples: Poisson arrivals at `--rate`, `--input-len` random
    tokens, the adapter `pick(rng)` draws, from `--seed`."""
    rng = random.Random(args.seed)
    at, work = 0.0, []
    for _ in range(args.num_requests):
        at += rng.expovariate(args.rate)
        prompt = [rng.randrange(100, 40000) for _ in range(args.input_len)]
        work.append((at, prompt, pick(rng)))
    return work


def make_workload(args, loras: list[LoRARequest]) -> list[tuple[float, list[int], LoRARequest]]:
    """Adapter i drawn with weight 1/(i+1)^alpha."""
    weights = [1 / (i + 1) ** args.alpha for i in range(len(loras))]
    return arrivals(args, lambda rng: rng.choices(loras, weights)[0])


async def run_workload(engine, work, output_len: int) -> dict:
    """Send `work` on its arrival times; the summary (TTFT p50/p99, end-to-end p50, output
    tokens a second) and each request's wall-clock times under "requests" (sent, first
    token, done: `time.time()`, the replicas' trace clock)."""
    params = SamplingParams(max_tokens=output_len, temperature=0, ignore_eos=True)
    start = time.perf_counter()
    rows: list[dict] = []

    async def one(i: int, at: float, prompt: list[int], lora) -> None:
        await asyncio.sleep(max(0.0, start + at - time.perf_counter()))
        row = {"id": f"r{i}", "adapter": lora.lora_name if lora else None, "sent": time.time()}
        tokens = 0
        async for out in engine.generate({"prompt_token_ids": prompt}, params, f"r{i}", lora):
            tokens = len(out.outputs[0].token_ids)
            if "first" not in row and tokens:
                row["first"] = time.time()
        row["done"], row["tokens"] = time.time(), tokens
        rows.append(row)

    await asyncio.gather(*(one(i, *w) for i, w in enumerate(work)))
    elapsed = time.perf_counter() - start
    rows.sort(key=lambda r: r["sent"])
    ttfts = sorted(r["first"] - r["sent"] for r in rows)
    e2es = sorted(r["done"] - r["sent"] for r in rows)
    return {
        "ttft_p50_s": percentile(ttfts, 50),
        "ttft_p99_s": percentile(ttfts, 99),
        "e2e_p50_s": percentile(e2es, 50),
        "output_tok_per_s": sum(r["tokens"] for r in rows) / elapsed,
        "elapsed_s": elapsed,
        "requests": rows,
    }


async def loads(engine) -> tuple[int, int, int]:
    """Adapter loads from files and into slots, summed over the replicas, and how many
    adapters more than one replica holds now (Ray Serve's multiplexed LRUs)."""
    reports = await engine.replica_reports()
    rows = [row for r in reports for row in r.stats.adapter_loads.values()]
    held = [name for r in reports for name in r.multiplexed]
    shared = len({name for name in held if held.count(name) > 1})
    return sum(row[0] for row in rows), sum(row[2] for row in rows), shared


def measure(name: str, settings: GatewaySettings, router, work, args) -> dict:
    app_name = "bench-" + "".join(c for c in name if c.isalnum())
    replicas = RayReplicas(settings, request_router=router, app_name=app_name)
    engine = replicas.start()
    try:

        async def go() -> dict:
            await asyncio.sleep(1.0)  # every replica has reported to the board
            disk0, device0, _ = await loads(engine)
            result = await run_workload(engine, work, args.output_len)
            del result["requests"]
            await asyncio.sleep(0.6)  # the last reports are in
            disk1, device1, shared = await loads(engine)
            return {
                "config": name,
                "disk_loads": disk1 - disk0,
                "slot_loads": device1 - device0,
                "adapters_on_both": shared,
                **result,
            }

        return asyncio.run(go())
    finally:
        replicas.stop()


def report(args, results: list[dict], columns: dict[str, str], **extra) -> None:
    """Write the run's record to `args.out` and print the machine line and a table of
    `columns` (a result's key: its header)."""
    args.out.parent.mkdir(parents=True, exist_ok=True)
    record = {"args": vars(args) | {"out": str(args.out)} | extra, "results": results}
    args.out.write_text(json.dumps(record, indent=2))
    shown = {
        "ttft_p50_s": "{:.3f} s",
        "ttft_p99_s": "{:.3f} s",
        "e2e_p50_s": "{:.3f} s",
        "output_tok_per_s": "{:.1f}",
    }
    print(machine_line())
    rows = [[shown.get(k, "{}").format(r[k]) for k in columns] for r in results]
    print_table(list(columns.values()), rows)


def main() -> None:
    args = parse_args()
    source = resolve_base_model(args.model)
    results = []
    with tempfile.TemporaryDirectory() as tmp, ray_cluster():
        loras = make_adapters(source, Path(tmp), args.num_adapters)
        work = make_workload(args, loras)
        engine = engine_config(args)

        def settings(n: int) -> GatewaySettings:
            return GatewaySettings(engine=engine, replicas=n, replica_cpus=0.5)

        for name, n, router in [
            ("2 replicas, multiplexed routing", 2, None),
            ("2 replicas, round robin", 2, RoundRobinRouter),
            ("1 replica", 1, None),
        ]:
            results.append(measure(name, settings(n), router, work, args))
            print(json.dumps(results[-1]), flush=True)
    columns = {"config": "config", "disk_loads": "disk loads", "slot_loads": "slot loads"}
    columns |= {"adapters_on_both": "adapters on >1 replica at the end"}
    columns |= {"ttft_p50_s": "TTFT p50", "ttft_p99_s": "TTFT p99", "e2e_p50_s": "e2e p50"}
    report(args, results, columns | {"output_tok_per_s": "out tok/s"})


if __name__ == "__main__":
    main()
