"""The three routing policies the fleet model compares, each as the real router decides.

- round robin: each replica in turn, blind to adapters (benchmarks/replicas_round_robin.py).
- multiplexed: Ray Serve's default router for multiplexed model ids
  (PowerOfTwoChoicesRequestRouter with MultiplexMixin): two random replicas among those
  holding the adapter, the one with fewer requests in flight; when none holds it, or all
  that hold it are full (`max_ongoing_requests`), two among those holding the fewest ids.
- spill: loragate's rule (gateway/replicas/spill_router.py) on top of multiplexed: when
  every holder has `spill_at` or more in flight and another replica has at most `idle_at`,
  the least loaded of those takes the request and loads the adapter too.
"""

from __future__ import annotations

import random

from .replica import Replica


class Holders:
    """Which replicas hold each adapter in their CPU tier or are loading it, as the
    replicas last reported to Ray Serve's router (their multiplexed model ids)."""

    def __init__(self) -> None:
        self.of: dict[int, set[int]] = {}

    def add(self, adapter: int, replica: int) -> None:
        self.of.setdefault(adapter, set()).add(replica)

    def drop(self, adapter: int, replica: int) -> None:
        held = self.of.get(adapter)
        if held is not None:
            held.discard(replica)
            if not held:
                del self.of[adapter]


class RoundRobin:
    name = "round robin"

    def __init__(self, seed: int = 0) -> None:
        self.turn = 0

    def choose(self, adapter: int, replicas: list[Replica], holders: Holders) -> Replica:
        self.turn += 1
        return replicas[(self.turn - 1) % len(replicas)]


class Multiplexed:
    name = "Ray Serve multiplexed"

    def __init__(self, seed: int = 0) -> None:
        self.rng = random.Random(seed)

    def choose(self, adapter: int, replicas: list[Replica], holders: Holders) -> Replica:
        full = replicas[0].cap.max_num_seqs
        held = [replicas[i] for i in holders.of.get(adapter, ()) if replicas[i].in_flight < full]
        if held:
            return self._two_choices(held)
        open_ = [r for r in replicas if r.in_flight < full] or replicas
        fewest = min(len(r.reported) for r in open_)
        return self._two_choices([r for r in open_ if len(r.reported) == fewest])

    def _two_choices(self, candidates: list[Replica]) -> Replica:
        if len(candidates) == 1:
            return candidates[0]
        a, b = self.rng.sample(candidates, 2)
        return a if a.in_flight <= b.in_flight else b


class Spill(Multiplexed):
    name = "loragate spill"

    def __init__(self, seed: int = 0, spill_at: int = 4, idle_at: int = 1) -> None:
        super().__init__(seed)
        self.spill_at, self.idle_at = spill_at, idle_at
        self.name = f"loragate spill at {spill_at}"
        self.spilled = 0

    def choose(self, adapter: int, replicas: list[Replica], holders: Holders) -> Replica:
        held = holders.of.get(adapter, ())
        if held and min(replicas[i].in_flight for i in held) >= self.spill_at:
            idle = [r for r in replicas if r.in_flight <= self.idle_at and r.index not in held]
            if idle:
                self.spilled += 1
                return min(idle, key=lambda r: (r.in_flight, r.index))
        return super().choose(adapter, replicas, holders)


POLICIES = {"round-robin": RoundRobin, "multiplexed": Multiplexed, "spill": Spill}
