"""The token budget of one engine step, sized so a step takes about `max_step_ms`.

Stall-free batching (Sarathi-Serve, OSDI 2024): every step carries all running decodes plus
prompt chunks up to a token budget, so a burst of prompts never freezes the streams already
decoding for longer than one step. A fixed GPU-sized budget (4096 tokens) takes seconds on a
few CPU cores; this one follows the machine. Step time is modelled as a line, a fixed cost
per step plus a cost per token, fitted by least squares to the warm-up forwards timed at
start and then to the engine's own steps, with older steps forgotten exponentially: a
loaded or slower machine gets a smaller budget within a few dozen steps. An explicit
`max_num_batched_tokens` overrides all of it and never changes (tests and vLLM users rely
on that).
"""

from __future__ import annotations

import logging

from loragate.engine.core.step_timing import time_forward

log = logging.getLogger(__name__)

# Upper bound of a measured budget: where the per-token cost is tiny (a GPU, a tiny model)
# the step time is all fixed cost and a bigger budget only delays the decodes in the step.
MAX_MEASURED_BUDGET = 8192
# Lower bound of a measured budget: in smaller steps the fixed cost of a step (reading every
# weight once) is most of its time, so prompts would take many times longer to prefill.
MIN_MEASURED_BUDGET = 64
FORGET = 0.05  # weight lost by older observations at each step (a memory of ~20 steps)
WARMUP_WEIGHT = 4.0  # the start-up timings count as this many steps


class StepBudget:
    """Tokens one step may compute: fixed if given, else from timings and `max_step_ms`."""

    def __init__(
        self,
        max_step_ms: float,
        *,
        floor: int,
        fixed_tokens: int | None = None,
        timings: dict[int, float] | None = None,
    ):
        self.max_step_ms = max_step_ms
        self.floor = floor  # one decode batch (max_num_seqs), or a whole prompt unchunked
        self.fixed_tokens = fixed_tokens
        self._sums = [0.0] * 5  # weighted: n, sum x, sum x^2, sum y, sum x*y
        for tokens, ms in (timings or {}).items():
            self._add(tokens, ms, WARMUP_WEIGHT)
        self.fixed_ms, self.ms_per_token = self._fit()
        self.tokens = fixed_tokens if fixed_tokens is not None else self._from_fit()

    @property
    def measured(self) -> bool:
        return self.fixed_tokens is None

    def predicted_ms(self, num_tokens: int) -> float:
        return self.fixed_ms + self.ms_per_token * num_tokens

    def observe(self, num_tokens: int, ms: float) -> None:
        """One step's token count and wall time keep the measured budget current."""
        if not self.measured or num_tokens <= 0:
            return
        self._sums = [v * (1.0 - FORGET) for v in self._sums]
        self._add(num_tokens, ms, 1.0)
        self.fixed_ms, self.ms_per_token = self._fit()
        self.tokens = self._from_fit()

    def _add(self, x: float, y: float, w: float) -> None:
        for i, v in enumerate((1.0, x, x * x, y, x * y)):
            self._sums[i] += w * v

    def _fit(self) -> tuple[float, float]:
        """Least-squares line; where the sizes seen are too alike, or the slope comes out
        negative (noise), all of the time is put on the tokens: a smaller, safe budget."""
        n, sx, sxx, sy, sxy = self._sums
        if n <= 0 or sx <= 0:
            return 0.0, 0.0
        spread = n * sxx - sx * sx
        if spread > 1e-9 * n * sxx:
            slope = (n * sxy - sx * sy) / spread
            fixed = (sy - slope * sx) / n
            if slope > 0 and fixed >= 0:
                return fixed, slope
        return 0.0, max(sy, 0.0) / sx

    def _from_fit(self) -> int:
        if self.ms_per_token <= 0:
            return max(self.floor, MAX_MEASURED_BUDGET)
        tokens = int((self.max_step_ms - self.fixed_ms) / self.ms_per_token)
        return max(self.floor, MIN_MEASURED_BUDGET, min(MAX_MEASURED_BUDGET, tokens))

    def describe(self) -> str:
        if not self.measured:
            return f"{self.tokens} tokens per step (max_num_batched_tokens)"
        return (
            f"{self.tokens} tokens per step for max_step_ms={self.max_step_ms:g} "
            f"(measured: {self.fixed_ms:.1f} ms per step + {self.ms_per_token:.3f} ms per token)"
        )


def step_budget_for(config, model, kv_cache, max_model_len: int) -> StepBudget:
    """The engine's budget: the explicit one, or one timed on this machine now."""
    floor = config.max_num_seqs
    if not config.enable_chunked_prefill:  # a whole prompt must fit one step
        floor = max(floor, max_model_len)
    if config.max_num_batched_tokens is not None:
        return StepBudget(
            config.max_step_ms, floor=floor, fixed_tokens=config.max_num_batched_tokens
        )
    budget = StepBudget(
        config.max_step_ms, floor=floor, timings=time_forward(model, kv_cache, max_model_len)
    )
    if budget.predicted_ms(budget.tokens) > config.max_step_ms:
        log.warning(
            "max_step_ms=%g is shorter than a step of %d tokens takes here (about %.0f ms), "
            "and a step holds at least one decode batch (max_num_seqs=%d): steps will take "
            "longer. Raise max_step_ms, or lower max_num_seqs",
            config.max_step_ms,
            budget.tokens,
            budget.predicted_ms(budget.tokens),
            config.max_num_seqs,
        )
    return budget
