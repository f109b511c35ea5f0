"""The requests the fleet model serves: adapters drawn with Zipf popularity (adapter i, from
0, with weight 1/(i+1)^s), arriving as a Poisson process or in bursts.

Bursty arrivals alternate on and off periods (exponential lengths, `burst_period_s` on
average for the pair): `burst_factor` times the mean rate while on, the rate that keeps the
mean while off. The same seed gives the same requests, so benchmarks/fleet/check_run.py
sends a real deployment exactly what the model is then given.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Workload:
    adapters: int
    rate: float  # requests per second, on average
    num_requests: int
    zipf: float = 1.0
    arrivals: str = "poisson"  # or "bursty"
    burst_factor: float = 4.0
    burst_fraction: float = 0.2  # the share of time spent in bursts
    burst_period_s: float = 10.0
    input_len: int = 32
    output_len: int = 16
    seed: int = 0

    def requests(self) -> tuple[np.ndarray, np.ndarray]:
        """(arrival seconds, adapter index) of every request, arrivals ascending."""
        rng = np.random.default_rng(self.seed)
        weights = 1.0 / np.arange(1, self.adapters + 1) ** self.zipf
        cdf = np.cumsum(weights / weights.sum())
        picks = np.minimum(np.searchsorted(cdf, rng.random(self.num_requests)), self.adapters - 1)
        if self.arrivals == "poisson":
            times = np.cumsum(rng.exponential(1.0 / self.rate, self.num_requests))
        elif self.arrivals == "bursty":
            times = self._bursty(rng)
        else:
            raise ValueError(f"arrivals must be poisson or bursty, got {self.arrivals!r}")
        return times, picks

    def _bursty(self, rng: np.random.Generator) -> np.ndarray:
        on = self.rate * self.burst_factor
        if not 0 < self.burst_fraction < 1 or self.burst_factor * self.burst_fraction >= 1:
            raise ValueError("bursts must leave a positive rate off: factor * fraction < 1")
        off = self.rate * (1 - self.burst_factor * self.burst_fraction) / (1 - self.burst_fraction)
        times, t, bursting = [], 0.0, False
        while len(times) < self.num_requests:
            share = self.burst_fraction if bursting else 1 - self.burst_fraction
            end = t + rng.exponential(self.burst_period_s * share)
            rate = on if bursting else off
            while len(times) < self.num_requests:
                t += rng.exponential(1.0 / rate)
                if t > end:
                    t = end  # memoryless: the next period starts its own clock here
                    break
                times.append(t)
            bursting = not bursting
        return np.asarray(times)
