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
import json
import random
import tempfile
import time
from pathlib import Path

import ray
from ray import serve
from replicas_round_robin import RoundRobinRouter

from loragate.adapters import LoRARequest
from loragate.engine import EngineConfig, SamplingParams
from loragate.gateway.replicas.cluster import RayReplicas
from loragate.gateway.settings import GatewaySettings
from loragate.tools import make_random_adapter
from loragate.tools.base_model import load_hf_model, resolve_base_model

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
    base = load_hf_model(source.hf_dir)
    loras = []
    for i in range(n):
        path = make_random_adapter(
            base,
            root / f"a{i:02d}",
            rank=8,
            targets=TARGETS,
            seed=i,
            base_model_name=source.name,
        )
        loras.append(LoRARequest(f"a{i:02d}", i + 1, str(path)))
    return loras


def make_workload(args, loras: list[LoRARequest]) -> list[tuple[float, list[int], LoRARequest]]:
    rng = random.Random(args.seed)
    weights = [1 / (i + 1) ** args.alpha for i in range(len(loras))]
    at, work = 0.0, []
    for _ in range(args.num_requests):
        at += rng.expovariate(args.rate)
        prompt = [rng.randrange(100, 40000) for _ in range(args.input_len)]
        work.append((at, prompt, rng.choices(loras, weights)[0]))
    return work


async def run_workload(engine, work, output_len: int) -> dict:
    params = SamplingParams(max_tokens=output_len, temperature=0, ignore_eos=True)
    start = time.perf_counter()

    async def one(i: int, at: float, prompt: list[int], lora: LoRARequest) -> tuple:
        await asyncio.sleep(max(0.0, start + at - time.perf_counter()))
        sent, first = time.perf_counter(), None
        tokens = 0
        async for out in engine.generate({"prompt_token_ids": prompt}, params, f"r{i}", lora):
            tokens = len(out.outputs[0].token_ids)
            if first is None and tokens:
                first = time.perf_counter()
        return first - sent, time.perf_counter() - sent, tokens

    results = await asyncio.gather(*(one(i, *w) for i, w in enumerate(work)))
    elapsed = time.perf_counter() - start
    ttfts = sorted(r[0] for r in results)
    e2es = sorted(r[1] for r in results)
    return {
        "ttft_p50_s": _pct(ttfts, 50),
        "ttft_p99_s": _pct(ttfts, 99),
        "e2e_p50_s": _pct(e2es, 50),
        "output_tok_per_s": sum(r[2] for r in results) / elapsed,
        "elapsed_s": elapsed,
    }


def _pct(values: list[float], p: float) -> float:
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


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


def main() -> None:
    args = parse_args()
    source = resolve_base_model(args.model)
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        object_store_memory=128 * 1024 * 1024,
        namespace="loragate",
    )
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        loras = make_adapters(source, Path(tmp), args.num_adapters)
        work = make_workload(args, loras)
        engine = EngineConfig(
            model=args.model,
            enable_lora=True,
            max_loras=args.slots,
            max_cpu_loras=args.slots * 2,
            max_lora_rank=8,
            num_kv_blocks=1024,
            max_model_len=512,
        )

        def settings(n: int) -> GatewaySettings:
            return GatewaySettings(engine=engine, replicas=n, replica_cpus=0.5)

        for name, n, router in [
            ("2 replicas, multiplexed routing", 2, None),
            ("2 replicas, round robin", 2, RoundRobinRouter),
            ("1 replica", 1, None),
        ]:
            results.append(measure(name, settings(n), router, work, args))
            print(json.dumps(results[-1]), flush=True)
    serve.shutdown()
    ray.shutdown()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps({"args": vars(args) | {"out": str(args.out)}, "results": results}, indent=2)
    )
    print(
        "| config | disk loads | slot loads | adapters on >1 replica at the end | TTFT p50 "
        "| TTFT p99 | e2e p50 | out tok/s |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r['config']} | {r['disk_loads']} | {r['slot_loads']} | "
            f"{r['adapters_on_both']} | "
            f"{r['ttft_p50_s']:.3f} s | {r['ttft_p99_s']:.3f} s | {r['e2e_p50_s']:.3f} s | "
            f"{r['output_tok_per_s']:.1f} |"
        )


if __name__ == "__main__":
    main()
