"""Drive an engine step by step with tenants' requests arriving at chosen steps, and note the
step each request was first scheduled in, so fairness is measured in steps, not wall time.

Imported by bare name: pytest puts tests/engine on sys.path.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from loragate.engine import SamplingParams


@dataclass
class Arrival:
    step: int
    request_id: str
    prompt: list[int]
    tenant: str
    lora: object = None
    params: SamplingParams | None = None
    priority: int = 0
    weight: float = 1.0


@dataclass
class Trace:
    added: dict[str, int] = field(default_factory=dict)  # request_id -> step it arrived before
    admitted: dict[str, int] = field(default_factory=dict)  # request_id -> first step it ran in
    outputs: dict[str, list[int]] = field(default_factory=dict)
    tenant_of: dict[str, str] = field(default_factory=dict)
    steps: int = 0

    def queue_steps(self, request_id: str) -> int:
        """Steps from arrival to its first step, that step counted (1 = at once)."""
        return self.admitted[request_id] - self.added[request_id] + 1

    def mean_queue_steps(self, tenant: str) -> float:
        ids = [r for r, t in self.tenant_of.items() if t == tenant]
        return sum(self.queue_steps(r) for r in ids) / len(ids)

    def admission_order(self) -> list[str]:
        return sorted(self.admitted, key=lambda r: (self.admitted[r], r))

    def admitted_by(self, tenant: str, step: int) -> int:
        """How many of the tenant's requests had been admitted by the end of `step`."""
        return sum(1 for r, s in self.admitted.items() if s <= step and self.tenant_of[r] == tenant)


def run(engine, arrivals: list[Arrival], default: SamplingParams, on_step=None) -> Trace:
    """Run every arrival to completion; `on_step(step, trace)` is called after each step and
    may return more arrivals (a tenant that keeps its queue full)."""
    pending = sorted(arrivals, key=lambda a: a.step)
    trace = Trace()
    live = {}
    step = 0
    while pending or engine.has_unfinished_requests():
        while pending and pending[0].step <= step:
            a = pending.pop(0)
            live[a.request_id] = engine.add_request(
                a.request_id,
                {"prompt_token_ids": a.prompt},
                a.params or default,
                a.lora,
                tenant=a.tenant,
                priority=a.priority,
                tenant_weight=a.weight,
            )
            trace.added[a.request_id] = step
            trace.tenant_of[a.request_id] = a.tenant
        for out in engine.step():
            if out.finished:
                assert out.error is None, out.error
                trace.outputs[out.request_id] = out.outputs[0].token_ids
        for request_id, request in list(live.items()):
            if request.first_scheduled_time is not None:
                trace.admitted[request_id] = step
                del live[request_id]
        if on_step is not None:
            pending.extend(on_step(step, trace) or ())
            pending.sort(key=lambda a: a.step)
        step += 1
        assert step < 5000, "the run does not end"
    trace.steps = step
    return trace
