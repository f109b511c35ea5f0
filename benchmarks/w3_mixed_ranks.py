"""W3 of benchmarks/vs_vllm.py: 64 adapters of mixed ranks (8, 16, 32, 64, 128, all seven
projections), power-law popularity, 128 requests; and what bounds its LoRA time here: the
bytes of adapter weights each step reads, against the machine's memory bandwidth measured in
the same run (a STREAM-style copy)."""

from __future__ import annotations

import random
import time
from pathlib import Path

import torch
from harness import kept_adapters
from offline_workloads import power_law_choice

W3_ADAPTERS = 64
W3_RANKS = (8, 16, 32, 64, 128)
W3_REQUESTS = 128
POWER_LAW_ALPHA = 0.3


def make_w3_adapters(source) -> list[Path]:
    """Adapter i has rank W3_RANKS[i % 5]; made once and kept under results/."""
    return kept_adapters(source, W3_ADAPTERS, rank=W3_RANKS, prefix="w3-")


def w3_requests(base_requests: list[dict], seed: int) -> list[dict]:
    """Twice W1's requests (128), spread over the 64 adapters by a power law."""
    rng = random.Random(seed + 3)
    doubled = (base_requests * 2)[:W3_REQUESTS]
    return [{**r, "adapter": power_law_choice(rng, W3_ADAPTERS, POWER_LAW_ALPHA)} for r in doubled]


def stream_bandwidth_gb_s(megabytes: int = 512, repeats: int = 5) -> float:
    """Best of ``repeats`` copies of a ``megabytes`` buffer: bytes read plus bytes written
    per second, as STREAM's copy counts them."""
    source = torch.ones(megabytes * 2**20 // 4)
    target = torch.empty_like(source)
    best = float("inf")
    for _ in range(repeats):
        began = time.perf_counter()
        target.copy_(source)
        best = min(best, time.perf_counter() - began)
    return 2 * source.numel() * 4 / best / 1e9


def adapter_bytes(adapter_dir: Path, hf_dir: Path, dtype: torch.dtype) -> int:
    """The bytes of one adapter's A and B in the serving dtype."""
    from safetensors import safe_open

    with safe_open(str(adapter_dir / "adapter_model.safetensors"), framework="pt") as handle:
        count = sum(
            handle.get_slice(k).get_shape()[0] * handle.get_slice(k).get_shape()[1]
            for k in handle.keys()
        )
    return count * torch.empty(0, dtype=dtype).element_size()


class StepAdapters:
    """Wraps an engine's scheduler to note the distinct adapters of every step."""

    def __init__(self, engine):
        self.steps: list[set] = []
        schedule = engine.scheduler.schedule

        def noted():
            out = schedule()
            items = out.prefills + out.decodes
            names = {i.seq.lora_request.lora_name for i in items if i.seq.lora_request}
            self.steps.append(names)
            return out

        engine.scheduler.schedule = noted
        self._restore = lambda: setattr(engine.scheduler, "schedule", schedule)

    def stop(self) -> None:
        self._restore()
