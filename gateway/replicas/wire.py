"""What crosses between the ingress and a replica: plain, picklable data (never tensors).

A request crosses as the engine's own EngineRequest (loragate.engine), whole; what comes
back is its RequestOutputs, or a Failure; these are the rest."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from loragate.engine import EngineStats


@dataclass(frozen=True)
class AdapterSummary:
    """What registration reads of a loaded adapter (the weights stay on the replica)."""

    rank: int
    alpha: float
    target_modules: tuple[str, ...]
    sha256: str
    size_bytes: int
    kind: str = "lora"  # the loaded adapter's kind: "lora", "dora", "lora+saved-modules"...


@dataclass(frozen=True)
class Failure:
    """An exception raised on the replica, carried back as a value so that the ingress
    re-raises it as itself (a ValueError stays a 400), not as Ray's wrapper of it."""

    error: BaseException


@dataclass
class ReplicaReport:
    """One replica's state, as it last reported it to the board."""

    replica: str  # Ray Serve's replica id
    actor_name: str  # the replica's Ray actor (what `ray.kill` takes)
    stats: EngineStats
    multiplexed: tuple[str, ...] = ()  # adapter names Ray Serve routes here (its LRU)
    reported_at: float = field(default_factory=time.time)
    retired_seen: int = 0  # how many retired adapters the board has handed this replica
    store_fetches: int = 0  # adapter store objects this replica downloaded into its cache
    node: str = ""  # the Ray node the replica runs on (its id, hex)
    torch_threads: int = 0  # the threads its engine's steps run on (its whole CPUs, >= 1)
