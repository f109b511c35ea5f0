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
import json
import sys
import tempfile
from pathlib import Path

from replicas import (
    arrivals,
    engine_config,
    make_adapters,
    measure,
    parse_args,
    ray_cluster,
    report,
)
from replicas_round_robin import RoundRobinRouter

from loragate.adapters import LoRARequest
from loragate.adapters.store import S3Store, identity_of, object_id
from loragate.gateway.settings import GatewaySettings
from loragate.tools.base_model import resolve_base_model


def workload(args, loras, hot: float) -> list:
    """(arrival, prompt, adapter) triples: `hot` of them name loras[0], the rest the others
    uniformly (hot=0: every adapter uniformly)."""
    others = loras[1:] if hot else loras
    return arrivals(args, lambda rng: loras[0] if rng.random() < hot else rng.choice(others))


def nodes_arg() -> int:
    """`--nodes N`, taken out of the command line before benchmarks/replicas.py's parser
    reads the rest (0: one local Ray, as before)."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--nodes", type=int, default=0)
    known, rest = p.parse_known_args()
    sys.argv[1:] = rest
    return known.nodes


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
    with tempfile.TemporaryDirectory() as tmp, ray_cluster(nodes) as (address, store):
        loras = make_adapters(source, Path(tmp), args.num_adapters)
        if store is not None:
            loras = uploaded(loras, store)
        engine = engine_config(args)

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
    columns = {"config": "config", "disk_loads": "disk loads"}
    columns |= {"adapters_on_both": "adapters on both"}
    columns |= {"ttft_p50_s": "TTFT p50", "ttft_p99_s": "TTFT p99", "output_tok_per_s": "out tok/s"}
    report(args, results, columns, hot=hot, nodes=nodes)


if __name__ == "__main__":
    main()
