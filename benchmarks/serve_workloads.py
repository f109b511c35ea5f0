"""The request lists benchmarks/serve.py sends (random prompts at a rate, and the long mix:
streams decoding while long prompts arrive) and what it records of each."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field


@dataclass
class Request:
    prompt_ids: list[int]
    max_tokens: int
    adapter: str | None
    arrival: float  # seconds after the start (after the gate below opens, if any)
    after_first_tokens: int = 0  # sent once this many requests have their first token


def make_workload(args, vocab_size: int, adapters: list[str]) -> list[Request]:
    """Seeded prompts, output lengths, adapters (power law) and arrival times (gamma)."""
    rng = random.Random(args.seed)
    weights = [1.0 / (rank + 1) ** args.popularity_exponent for rank in range(len(adapters))]
    arrivals = arrival_times(args.num_prompts, args.request_rate, args.burstiness, rng)
    requests = []
    for arrival in arrivals:
        input_len = _around(args.input_len, args.range_ratio, rng)
        output_len = _around(args.output_len, args.range_ratio, rng)
        adapter = None
        if adapters and rng.random() >= args.base_fraction:
            adapter = rng.choices(adapters, weights)[0]
        ids = [rng.randrange(1000, vocab_size - 1000) for _ in range(input_len)]
        requests.append(Request(ids, output_len, adapter, arrival))
    return requests


def make_long_mix(args, vocab_size: int, adapters: list[str]) -> list[Request]:
    """--streams requests at once; once each streams, --long-prompts prompts of --long-len
    tokens arrive --long-gap-s apart: long prompts landing on running decodes."""
    rng = random.Random(args.seed)

    def ids(n: int) -> list[int]:
        return [rng.randrange(1000, vocab_size - 1000) for _ in range(n)]

    def adapter(i: int) -> str | None:
        return adapters[i % len(adapters)] if adapters else None

    streams = [
        Request(
            ids(_around(args.input_len, args.range_ratio, rng)), args.output_len, adapter(i), 0.0
        )
        for i in range(args.streams)
    ]
    longs = [
        Request(
            ids(args.long_len),
            args.long_output_len,
            adapter(i),
            i * args.long_gap_s,
            after_first_tokens=args.streams,
        )
        for i in range(args.long_prompts)
    ]
    return streams + longs


def _around(mean: int, ratio: float, rng: random.Random) -> int:
    return max(1, rng.randint(int(mean * (1 - ratio)), int(mean * (1 + ratio))))


def arrival_times(n: int, rate: float, burstiness: float, rng: random.Random) -> list[float]:
    """Gamma inter-arrival times with mean 1/rate; burstiness 1 is a Poisson process."""
    if math.isinf(rate):
        return [0.0] * n
    times, now = [], 0.0
    for _ in range(n):
        times.append(now)
        now += rng.gammavariate(burstiness, 1.0 / (rate * burstiness))
    return times


# ---- one run --------------------------------------------------------------------------------


@dataclass
class Result:
    ok: bool
    prompt_tokens: int = 0
    output_tokens: int = 0
    ttft: float = 0.0
    e2e: float = 0.0
    itl: list[float] = field(default_factory=list)
    error: str = ""
    token_times: list[float] = field(default_factory=list)  # perf_counter of each token
