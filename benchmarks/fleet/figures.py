"""The figures the fleet model runs on: one replica's step time and adapter load times,
measured on this machine (benchmarks/fleet/measure.py writes them to
benchmarks/fleet_figures.json), and its capacities (engine settings, not measurements).

Step time is linear in what a step computes: a fixed cost, each prompt token prefilled,
each running sequence decoded, and each distinct adapter in the batch (the batched LoRA
kernel's per-adapter segments), fitted by least squares on the engine's step records.

A disk load is measured twice: alone (nothing running, so not paced) and paced beside a
stepping engine with the other cores busy, as a replica's loader runs in a fleet on shared
cores. The paced time is not (1 + ratio) times the alone one there: each pause is a
multiple of its chunk's wall time, which waits for cores and the GIL beside the steps.
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from loragate.adapters.pacing import PAUSE_RATIO

FIGURES_JSON = Path(__file__).resolve().parent.parent / "fleet_figures.json"


@dataclass(frozen=True)
class StepTime:
    base_ms: float  # a step's fixed cost: schedule, sampling, outputs, launch
    per_prefill_token_ms: float
    per_decode_seq_ms: float
    per_adapter_ms: float  # each distinct adapter in the step

    def ms(self, prefill_tokens: int, decode_seqs: int, adapters: int) -> float:
        return (
            self.base_ms
            + self.per_prefill_token_ms * prefill_tokens
            + self.per_decode_seq_ms * decode_seqs
            + self.per_adapter_ms * adapters
        )


@dataclass(frozen=True)
class LoadTimes:
    """Milliseconds to bring one adapter up a tier (loragate's adapter tiers)."""

    store_ms: float  # adapter store to the replica's disk cache (fetch, sha256 check)
    disk_ms: float  # disk to the CPU tier (read, validate, convert), nothing else running
    slot_ms: float  # CPU tier to a device slot (on a CPU device: the slot borrows the rows)
    # While steps run, a load pauses `paced_ratio` times its own work after each chunk so as
    # not to stall them (adapters/pacing.py): it then takes (1 + ratio) times as long.
    paced_ratio: float = PAUSE_RATIO
    # A disk load's whole time, pauses included, measured while an engine steps beside it
    # (and other replicas' steps load the other cores: fleet/measure.py): its work then
    # waits for cores and the GIL, and each pause is `paced_ratio` times the work's wall
    # time, not its alone time. None (figures measured before it): (1 + ratio) * disk_ms.
    disk_paced_ms: float | None = None
    # Those measured times themselves (their spread: the cores and the GIL a load waits
    # for vary from one to the next); a paced load draws one at random. Empty: every paced
    # load takes `paced_ms()`.
    disk_paced_samples_ms: tuple[float, ...] = ()

    def paced_ms(self, rng: random.Random | None = None) -> float:
        """A disk load's time while steps run beside it: drawn from the measured ones when
        given `rng` and samples, else their median, else (1 + ratio) times its alone time."""
        if rng is not None and self.disk_paced_samples_ms:
            return rng.choice(self.disk_paced_samples_ms)
        if self.disk_paced_ms is not None:
            return self.disk_paced_ms
        return (1 + self.paced_ratio) * self.disk_ms


@dataclass(frozen=True)
class Capacity:
    slots: int = 4  # max_loras: distinct adapters per step
    cpu_tier: int = 8  # max_cpu_loras: Ray Serve's multiplexed LRU per replica
    max_num_seqs: int = 64  # also the deployment's max_ongoing_requests
    token_budget: int = 512  # max_num_batched_tokens per step

    def engine_options(self, model: str | None) -> dict:
        """The engine of these figures, `LLM`'s or `EngineConfig`'s keywords: measured so by
        fleet/measure.py and deployed so by fleet/check_run.py (rank-8 adapters, 1024 KV
        blocks, 512 tokens a sequence)."""
        return dict(
            model=model,
            enable_lora=True,
            max_loras=self.slots,
            max_cpu_loras=self.cpu_tier,
            max_lora_rank=8,
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.token_budget,
            num_kv_blocks=1024,
            max_model_len=512,
        )


@dataclass(frozen=True)
class Figures:
    step: StepTime
    load: LoadTimes
    capacity: Capacity = field(default_factory=Capacity)
    overhead_ms: float = 0.0  # ingress to replica and the first token back, beyond the step
    # Steps this many times slower than measured alone: replicas sharing cores with the
    # ingress and each other (fleet/check.py takes it from the real run's decode rate; 1 for
    # replicas on cores of their own).
    step_scale: float = 1.0
    # The spread the means above leave out, as measured in a run (fleet/check_run.py's
    # trace): each step's time over the fit's, and each request's ingress overhead in ms,
    # each at evenly spaced quantiles. A simulated step or request draws one at random;
    # empty: every step exactly the fit, every request `overhead_ms`.
    step_noise: tuple[float, ...] = ()
    overhead_spread_ms: tuple[float, ...] = ()
    source: dict = field(default_factory=dict)  # machine, date, command, what was measured

    def with_capacity(self, **changes) -> Figures:
        return replace(self, capacity=replace(self.capacity, **changes))

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> Figures:
        return cls(
            step=StepTime(**data["step"]),
            load=LoadTimes(
                **data["load"]
                | {"disk_paced_samples_ms": tuple(data["load"].get("disk_paced_samples_ms", ()))}
            ),
            capacity=Capacity(**data.get("capacity", {})),
            overhead_ms=data.get("overhead_ms", 0.0),
            step_scale=data.get("step_scale", 1.0),
            step_noise=tuple(data.get("step_noise", ())),
            overhead_spread_ms=tuple(data.get("overhead_spread_ms", ())),
            source=data.get("source", {}),
        )


def load_figures(path: Path = FIGURES_JSON) -> Figures:
    return Figures.from_json(json.loads(Path(path).read_text()))
