"""Replica reports as an operator reads them: adapter names instead of weights hashes."""

from __future__ import annotations

import msgspec

from loragate.gateway.replicas.wire import ReplicaReport


class ReplicaAdapters(msgspec.Struct):
    device: list[str]  # in a device slot
    cpu: list[str]  # in the CPU tier only
    routed: list[str]  # Ray Serve's multiplexed LRU: what it routes to this replica


class ReplicaLoads(msgspec.Struct):
    disk: int  # adapter weights read from files
    device: int  # copied into a device slot
    store: int = 0  # adapter store objects fetched into this replica's cache


class ReplicaView(msgspec.Struct):
    id: str
    actor: str
    node: str  # the Ray node it runs on
    torch_threads: int  # the threads its engine's steps run on (its whole CPUs, >= 1)
    running: int
    waiting: int
    kv_usage: float
    kv_blocks_used: int
    kv_blocks_total: int
    adapters: ReplicaAdapters
    adapter_loads: ReplicaLoads


class ReplicaList(msgspec.Struct):
    data: list[ReplicaView]
    mode: str  # "ray" (replicas on Ray Serve) or "single" (one engine in this process)
    object: str = "list"


def replica_view(report: ReplicaReport, names_of: dict[str, list[str]]) -> ReplicaView:
    """`names_of`: weights sha256 -> the registered adapter names with those weights."""
    stats = report.stats
    tiers: dict[str, list[str]] = {"device": [], "cpu": []}
    for sha, tier in stats.adapter_tiers.items():
        tiers.setdefault(tier, []).extend(names_of.get(sha, [f"sha256:{sha[:12]}"]))
    loads = list(stats.adapter_loads.values())
    return ReplicaView(
        id=report.replica,
        actor=report.actor_name,
        node=report.node,
        torch_threads=report.torch_threads,
        running=stats.running,
        waiting=stats.waiting,
        kv_usage=float(stats.memory.get("utilization", 0.0)),
        kv_blocks_used=int(stats.memory.get("allocated_blocks", 0)),
        kv_blocks_total=int(stats.memory.get("total_blocks", 0)),
        adapters=ReplicaAdapters(
            device=sorted(tiers["device"]),
            cpu=sorted(tiers["cpu"]),
            routed=list(report.multiplexed),
        ),
        adapter_loads=ReplicaLoads(
            disk=sum(row[0] for row in loads),
            device=sum(row[2] for row in loads),
            store=report.store_fetches,
        ),
    )
