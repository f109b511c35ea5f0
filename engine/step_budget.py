"""The token budget of one engine step, sized so a step takes about `max_step_ms`.

Stall-free batching (Sarathi-Serve, OSDI 2024): every step carries all running decodes plus
prompt chunks up to a token budget, so a burst of prompts never freezes the streams already
decoding for longer than one step. A fixed GPU-sized budget (4096 tokens) takes seconds on a
few CPU cores; this one follows the machine. At start a short warm-up times the model at two
sizes, giving a fixed cost per step and a cost per token; while the engine runs, an EWMA of
measured / predicted step time scales both, so a loaded or slower machine gets a smaller
budget. An explicit `max_num_batched_tokens` overrides all of it and never changes (tests
and vLLM users rely on that).
"""

from __future__ import annotations

import logging

from loragate.engine.step_timing import time_forward

log = logging.getLogger(__name__)

# Upper bound of a measured budget: where the per-token cost is tiny (a GPU, a tiny model)
# the step time is all fixed cost and a bigger budget only delays the decodes in the step.
MAX_MEASURED_BUDGET = 8192
EWMA_WEIGHT = 0.2  # weight of the newest step in the slowdown estimate
MAX_SLOWDOWN_SAMPLE = 8.0  # one stalled step (GC pause, adapter load) moves it at most this
MIN_SLOWDOWN_SAMPLE = 0.25


class StepBudget:
    """Tokens one step may compute: fixed if given, else from timings and `max_step_ms`."""

    def __init__(
        self,
        max_step_ms: float,
        *,
        floor: int,
        fixed_tokens: int | None = None,
        fixed_ms: float = 0.0,
        ms_per_token: float = 0.0,
    ):
        self.max_step_ms = max_step_ms
        self.floor = floor  # one decode batch (max_num_seqs), or a whole prompt unchunked
        self.fixed_tokens = fixed_tokens
        self.fixed_ms = fixed_ms
        self.ms_per_token = ms_per_token
        self.slowdown = 1.0  # measured step time / predicted, as an EWMA
        self.tokens = fixed_tokens if fixed_tokens is not None else self._from_timing()

    @property
    def measured(self) -> bool:
        return self.fixed_tokens is None

    def predicted_ms(self, num_tokens: int) -> float:
        return self.slowdown * (self.fixed_ms + self.ms_per_token * num_tokens)

    def observe(self, num_tokens: int, ms: float) -> None:
        """One step's token count and wall time keep the measured budget current."""
        if not self.measured or num_tokens <= 0:
            return
        base = self.fixed_ms + self.ms_per_token * num_tokens
        if base <= 0:
            return
        sample = min(MAX_SLOWDOWN_SAMPLE, max(MIN_SLOWDOWN_SAMPLE, ms / base))
        self.slowdown += EWMA_WEIGHT * (sample - self.slowdown)
        self.tokens = self._from_timing()

    def _from_timing(self) -> int:
        if self.ms_per_token <= 0:
            return max(self.floor, MAX_MEASURED_BUDGET)
        room = self.max_step_ms / self.slowdown - self.fixed_ms
        tokens = int(room / self.ms_per_token)
        return max(self.floor, min(MAX_MEASURED_BUDGET, tokens))

    def describe(self) -> str:
        if not self.measured:
            return f"{self.tokens} tokens per step (max_num_batched_tokens)"
        return (
            f"{self.tokens} tokens per step for max_step_ms={self.max_step_ms:g} "
            f"(measured: {self.fixed_ms:.1f} ms per step + {self.ms_per_token:.3f} ms per token)"
        )


def fit_line(timings: dict[int, float]) -> tuple[float, float]:
    """(fixed ms, ms per token) through the smallest and largest timed sizes, never < 0."""
    small, large = min(timings), max(timings)
    if large == small:
        return timings[small], 0.0
    per_token = max(0.0, (timings[large] - timings[small]) / (large - small))
    return max(0.0, timings[small] - per_token * small), per_token


def step_budget_for(config, model, kv_cache, max_model_len: int) -> StepBudget:
    """The engine's budget: the explicit one, or one timed on this machine now."""
    floor = config.max_num_seqs
    if not config.enable_chunked_prefill:  # a whole prompt must fit one step
        floor = max(floor, max_model_len)
    if config.max_num_batched_tokens is not None:
        return StepBudget(
            config.max_step_ms, floor=floor, fixed_tokens=config.max_num_batched_tokens
        )
    fixed_ms, per_token = fit_line(time_forward(model, kv_cache))
    budget = StepBudget(config.max_step_ms, floor=floor, fixed_ms=fixed_ms, ms_per_token=per_token)
    if budget.tokens == floor and budget.predicted_ms(floor) > config.max_step_ms:
        log.warning(
            "max_step_ms=%g is shorter than one step of %d tokens takes here (about %.0f ms): "
            "steps will take longer; raise max_step_ms or lower max_num_seqs (%d)",
            config.max_step_ms,
            floor,
            budget.predicted_ms(floor),
            config.max_num_seqs,
        )
    return budget
