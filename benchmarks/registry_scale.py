"""The registry at 100,000 adapters: how long each read takes on a Redis of its own.

Loads `--adapters` records (metadata only, over `--tenants` tenants) with the store's own
restore, then times each read a request or a list makes (median and p99 of `--repeat`
calls, one client, on this machine's loopback): a name lookup, a public name, a tenant's
counters, a page of 100 by key and of a tenant's view, the change log after a version,
and, for contrast, reading every record (what the gateway's sync did before the indexes).

    .venv/bin/python benchmarks/registry_scale.py --adapters 100000
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import subprocess
import time

import redis
from server_process import free_port

from loragate.registry import AdapterMetadata
from loragate.registry.redis_store import RedisRegistryStore
from loragate.registry.snapshot import RegistrySnapshot


def start_redis() -> tuple[subprocess.Popen, str]:
    port = free_port()
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server is not on PATH")
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
    )
    client = redis.Redis(port=port)
    for _ in range(200):
        try:
            client.ping()
            break
        except redis.ConnectionError:
            time.sleep(0.05)
    client.close()
    return proc, f"redis://127.0.0.1:{port}"


def records(tenants: int, per_tenant: int) -> list[AdapterMetadata]:
    out, now = [], time.time()
    for t in range(tenants):
        for i in range(per_tenant):
            n = t * per_tenant + i
            out.append(
                AdapterMetadata(
                    name=f"a{i:05d}",
                    tenant=f"t{t:04d}",
                    public=n % 1000 == 0,
                    base_model="base",
                    rank=8,
                    alpha=16.0,
                    target_modules=("q_proj", "v_proj"),
                    sha256="ab" * 32,
                    size_bytes=1000 + i,
                    path="upload",
                    store_object="ab" * 32 + "-" + "cd" * 32,
                    lora_int_id=n + 1,
                    created_at=now,
                )
            )
    return out


async def timed(call, repeat: int) -> tuple[float, float]:
    await call()  # a script's first call loads it
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        await call()
        times.append(time.perf_counter() - start)
    times.sort()
    return statistics.median(times), times[min(len(times) - 1, int(0.99 * len(times)))]


async def run(args, url: str) -> list[tuple[str, float, float]]:
    store = RedisRegistryStore(url, "bench", socket_timeout_s=120)
    await store.open()
    for t in range(args.tenants):
        await store.create_tenant(f"t{t:04d}")
    every = records(args.tenants, args.adapters // args.tenants)
    start = time.perf_counter()
    await store.restore(RegistrySnapshot(adapters=tuple(every)), expect_version=None)
    load_s = time.perf_counter() - start
    last = every[-1]
    version = await store.version()
    rows = [("load (one restore: staged 2,000 a round trip, switched in at once)", load_s, load_s)]
    reads = {
        "name lookup (get_adapter)": lambda: store.get_adapter(last.key),
        "public name (public_adapter)": lambda: store.public_adapter("a00000"),
        "tenant counters (adapter_counts)": lambda: store.adapter_counts(last.tenant),
        "page of 100 by key (page_adapters)": lambda: store.page_adapters(
            after=every[len(every) // 2].key, limit=100
        ),
        "page of 100, a tenant's view": lambda: store.page_visible_adapters(
            last.tenant, after="a00010", limit=100
        ),
        "changes since a version (10 changes)": lambda: store.changes_since(version - 10),
    }
    for what, call in reads.items():
        rows.append((what, *await timed(call, args.repeat)))
    rows.append(("every record (list_adapters)", *await timed(store.list_adapters, 3)))
    await store.close()
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--adapters", type=int, default=100_000)
    p.add_argument("--tenants", type=int, default=100)
    p.add_argument("--repeat", type=int, default=200)
    args = p.parse_args()
    proc, url = start_redis()
    try:
        rows = asyncio.run(run(args, url))
        used = redis.Redis.from_url(url).info("memory")["used_memory_human"]
    finally:
        proc.terminate()
        proc.wait(10)
    print(f"{args.adapters} adapters over {args.tenants} tenants; Redis holds {used}")
    print("| read | median | p99 |")
    print("|---|---|---|")
    for what, median, p99 in rows:
        print(f"| {what} | {median * 1000:.2f} ms | {p99 * 1000:.2f} ms |")


if __name__ == "__main__":
    main()
