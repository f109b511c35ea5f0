"""Drive an engine step by step with requests arriving at chosen steps, and record what each
step mixed, so equality tests can show they covered the hard paths.

Imported by bare name: pytest puts tests/engine on sys.path.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from loragate.engine import SamplingParams


@dataclass
class StepLog:
    """What the scheduler put in each step."""

    steps: list[dict] = field(default_factory=list)

    @property
    def mixed_steps(self) -> int:
        """Steps that prefill (or recompute) some sequences while others decode."""
        return sum(1 for s in self.steps if s["prefills"] and s["decodes"])

    @property
    def partial_chunks(self) -> int:
        """Prefill chunks that end before the prompt does."""
        return sum(s["partial_chunks"] for s in self.steps)

    @property
    def mixed_adapter_steps(self) -> int:
        """Steps whose tokens run under two or more different adapters (or base and one)."""
        return sum(1 for s in self.steps if len(s["slots"]) >= 2)


def record_steps(engine) -> StepLog:
    """Wrap the engine's scheduler so every step's mix is logged."""
    log = StepLog()
    schedule = engine.scheduler.schedule

    def logged():
        out = schedule()
        items = out.prefills + out.decodes
        log.steps.append(
            {
                "prefills": len(out.prefills),
                "decodes": len(out.decodes),
                "partial_chunks": sum(
                    1
                    for s in out.prefills
                    if s.seq.num_computed_tokens + s.num_new_tokens < s.seq.num_tokens
                ),
                "slots": {s.seq.lora_slot for s in items},
            }
        )
        return out

    engine.scheduler.schedule = logged
    return log


def greedy(n: int) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=n, min_tokens=n, ignore_eos=True)


def drive(engine, arrivals, params: SamplingParams) -> dict[str, list[int]]:
    """Run `arrivals` [(step, request_id, prompt_ids, lora_request)] to completion, adding
    each request before the given step; return every request's output token ids."""
    pending = sorted(arrivals, key=lambda a: a[0])
    done: dict[str, list[int]] = {}
    step = 0
    while pending or engine.has_unfinished_requests():
        while pending and pending[0][0] <= step:
            _, request_id, prompt, lora = pending.pop(0)
            engine.add_request(request_id, {"prompt_token_ids": prompt}, params, lora)
        for out in engine.step():
            if out.finished:
                assert out.error is None, out.error
                done[out.request_id] = out.outputs[0].token_ids
        step += 1
    return done


# A float32 engine with a small KV budget (preemptions) and a small token budget (chunked
# prefill), four adapter slots: the engine the adapter-kind and mixed-rank tests drive.
TIGHT_LORA_ENGINE = dict(
    dtype="float32",
    max_model_len=128,
    block_size=8,
    num_kv_blocks=24,
    max_num_batched_tokens=32,
    max_num_seqs=8,
    enable_lora=True,
    max_loras=4,
    max_lora_rank=8,
)


def drive_under_pressure(engine, arrivals, n: int) -> tuple[dict[str, list[int]], StepLog]:
    """`drive` with greedy(n), then check the hard paths ran: a prefill chunk that ends before
    its prompt, steps mixing prefill and decode, steps mixing adapters, a preemption."""
    log = record_steps(engine)
    outputs = drive(engine, arrivals, greedy(n))
    assert log.partial_chunks >= 1, "no prefill was chunked"
    assert log.mixed_steps >= 2, "no step mixed prefill and decode"
    assert log.mixed_adapter_steps >= 2, "no step mixed adapters"
    assert engine.scheduler.num_preemptions >= 1, "nothing was preempted"
    return outputs, log
