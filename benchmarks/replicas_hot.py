"""One hot adapter over two replicas: Ray Serve's multiplexed routing, round robin, and
loragate's spill rule (`--spill-at`), against the same load spread evenly.

`--hot` of the requests (default half) name one adapter, the rest the other adapters
uniformly; Poisson arrivals, random-token prompts, fixed-length `ignore_eos` outputs, as in
benchmarks/replicas.py (whose workload runner and measurement this reuses). Issue 46's goal:
with a hot adapter taking half the traffic, P99 TTFT within 1.5x of the even spread.

    .venv/bin/python benchmarks/replicas_hot.py --num-requests 96 --rate 3

`--nodes 2` runs the same comparison on a real multi-node Ray cluster on this machine
(`ray.cluster_utils.Cluster`, as tests/gateway/replicas/test_ray_nodes.py: a head with no
CPUs and N worker nodes of one CPU each, each its own raylet and object store), the
replicas asking for one CPU each so that Ray puts one on each node. Nothing is shared but
the adapter store: the adapters are uploaded to a bucket on moto's S3 server
(tests/s3_testlib.py) and each replica fetches what it is routed into its own cache.

    .venv/bin/python benchmarks/replicas_hot.py --num-requests 96 --rate 3 --nodes 2
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import sys
import tempfile
from pathlib import Path

import ray
from ray import serve
from replicas import make_adapters, measure, parse_args
from replicas_round_robin import RoundRobinRouter

from loragate.adapters import LoRARequest
from loragate.adapters.store import S3Store, identity_of, object_id
from loragate.engine import EngineConfig
from loragate.gateway.settings import GatewaySettings
from loragate.tools.base_model import resolve_base_model


def workload(args, loras, hot: float) -> list:
    """(arrival, prompt, adapter) triples: `hot` of them name loras[0], the rest the others
    uniformly (hot=0: every adapter uniformly)."""
    rng = random.Random(args.seed)
    at, work = 0.0, []
    for _ in range(args.num_requests):
        at += rng.expovariate(args.rate)
        prompt = [rng.randrange(100, 40000) for _ in range(args.input_len)]
        pick = loras[0] if rng.random() < hot else rng.choice(loras[1:] if hot else loras)
        work.append((at, prompt, pick))
    return work


def nodes_arg() -> int:
    """`--nodes N`, taken out of the command line before benchmarks/replicas.py's parser
    reads the rest (0: one local Ray, as before)."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--nodes", type=int, default=0)
    known, rest = p.parse_known_args()
    sys.argv[1:] = rest
    return known.nodes


@contextlib.contextmanager
def ray_nodes(nodes: int):
    """A multi-node Ray cluster on this machine and an S3 adapter store for it: (the head's
    address, the store's URI), and Ray joined; with `nodes` 0, one local Ray and no store."""
    if not nodes:
        ray.init(
            address="local",  # a Ray of its own, never another session's running one
            num_cpus=2,
            include_dashboard=False,
            log_to_driver=False,
            object_store_memory=128 * 1024 * 1024,
            namespace="loragate",
        )
        yield None, None
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
            ray.shutdown()
            cluster.shutdown()


def uploaded(loras: list[LoRARequest], uri: str) -> list[LoRARequest]:
    """Each adapter put in the store, named by its `adapter-store:<object id>` path."""
    store, out = S3Store(uri), []
    for lora in loras:
        oid = object_id(identity_of(Path(lora.lora_path)))
        store.put(oid, Path(lora.lora_path))
        out.append(LoRARequest(lora.lora_name, lora.lora_int_id, f"adapter-store:{oid}"))
    return out


def main() -> None:
    nodes = nodes_arg()
    args = parse_args()
    name = "replicas_hot_nodes.json" if nodes else "replicas_hot.json"
    args.out = Path(str(args.out).replace("replicas.json", name))
    hot, spill_at = 0.5, 2
    source = resolve_base_model(args.model)
    results = []
    with tempfile.TemporaryDirectory() as tmp, ray_nodes(nodes) as (address, store):
        loras = make_adapters(source, Path(tmp), args.num_adapters)
        if store is not None:
            loras = uploaded(loras, store)
        engine = EngineConfig(
            model=args.model,
            enable_lora=True,
            max_loras=args.slots,
            max_cpu_loras=args.slots * 2,
            max_lora_rank=8,
            num_kv_blocks=1024,
            max_model_len=512,
        )

        def settings(**extra) -> GatewaySettings:
            if nodes:  # one replica a node; each caches the store's objects on its own
                extra |= {
                    "replica_cpus": 1,
                    "ray_address": address,
                    "adapter_store": store,
                    "adapter_cache_dir": Path(tmp) / f"cache-{len(results)}" / "{replica}",
                }
            return GatewaySettings(engine=engine, replicas=2, **{"replica_cpus": 0.5} | extra)

        even, skewed = workload(args, loras, 0.0), workload(args, loras, hot)
        for name, config, router, work in [
            ("even load, multiplexed routing", settings(spill_at=0), None, even),
            ("hot adapter, multiplexed routing", settings(spill_at=0), None, skewed),
            ("hot adapter, round robin", settings(), RoundRobinRouter, skewed),
            (f"hot adapter, spill at {spill_at}", settings(spill_at=spill_at), None, skewed),
        ]:
            results.append(measure(name, config, router, work, args))
            print(json.dumps(results[-1]), flush=True)
        serve.shutdown()
    if not nodes:
        ray.shutdown()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    extra = {"out": str(args.out), "hot": hot, "nodes": nodes}
    record = {"args": vars(args) | extra, "results": results}
    args.out.write_text(json.dumps(record, indent=2))
    print("| config | disk loads | adapters on both | TTFT p50 | TTFT p99 | out tok/s |")
    print("|---|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r['config']} | {r['disk_loads']} | {r['adapters_on_both']} | "
            f"{r['ttft_p50_s']:.3f} s | {r['ttft_p99_s']:.3f} s | {r['output_tok_per_s']:.1f} |"
        )


if __name__ == "__main__":
    main()
