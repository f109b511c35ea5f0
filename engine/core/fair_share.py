"""Service counters per tenant, for fair admission (VTC, "Fairness in Serving Large Language
Models", OSDI 2024).

Each tenant (or, for requests without one, each adapter; else the base model) has a virtual
counter of the service it received: prompt tokens computed cost 1, generated tokens 2 (the
paper's weights: a generated token costs a forward pass of its own; both settable), divided
by the
tenant's weight, so a tenant of weight 2 is owed twice the tokens. A tenant that becomes
active again is lifted to the lowest counter among the active ones, so idle time is not
banked as credit. When no tenant is active the counters are forgotten: with nobody to be
fair to, history no longer matters, and the table never outgrows the tenants of one busy
period.
"""

from __future__ import annotations

import math
from collections import Counter

from loragate.engine.core.sequence import Request

PROMPT_TOKEN_COST = 1.0
OUTPUT_TOKEN_COST = 2.0
BASE_MODEL_KEY = "base"


def fair_share_key(request: Request) -> str:
    """Who a request's service is counted for: its tenant, else its adapter, else the base."""
    if request.tenant is not None:
        return request.tenant
    if request.lora_request is not None:
        return f"adapter:{request.lora_request.lora_name}"
    return BASE_MODEL_KEY


def check_tenant_weight(weight) -> float:
    """A tenant's share: a finite number > 0 (ValueError otherwise)."""
    if isinstance(weight, bool) or not isinstance(weight, int | float) or not weight > 0:
        raise ValueError(f"tenant_weight must be a number > 0, got {weight!r}")
    if not math.isfinite(weight):
        raise ValueError(f"tenant_weight must be finite, got {weight!r}")
    return float(weight)


class FairShare:
    """Virtual service counters of the active tenants, plus the raw tokens each received."""

    def __init__(
        self,
        prompt_token_cost: float = PROMPT_TOKEN_COST,
        output_token_cost: float = OUTPUT_TOKEN_COST,
    ) -> None:
        """The service one computed prompt token and one generated token count for (VTC's
        1 and 2 by default: `fair_prompt_token_cost`, `fair_output_token_cost`)."""
        self.prompt_token_cost = prompt_token_cost
        self.output_token_cost = output_token_cost
        self.virtual: dict[str, float] = {}  # service / weight, what admission compares
        self.weights: dict[str, float] = {}
        self.served: dict[str, float] = {}  # weighted tokens received since start (metrics)
        self.preempted: dict[str, int] = {}  # sequences preempted since start (metrics)
        self._active: Counter[str] = Counter()  # unfinished requests per key

    def arrive(self, request: Request, weight: float = 1.0) -> None:
        """A request enters the engine; its tenant's weight is the latest one given."""
        key = fair_share_key(request)
        self.weights[key] = weight
        if self._active[key] == 0:
            others = [self.virtual.get(k, 0.0) for k in self._active if self._active[k] > 0]
            lifted = min(others) if others else 0.0
            self.virtual[key] = max(self.virtual.get(key, 0.0), lifted)
        self._active[key] += 1

    def leave(self, request: Request) -> None:
        """A request ended; when no tenant is left active, the counters are forgotten."""
        key = fair_share_key(request)
        self._active[key] -= 1
        if self._active[key] <= 0:
            del self._active[key]
        if not self._active:
            self.virtual.clear()
            self.weights.clear()

    def charge(self, request: Request, prompt_tokens: int = 0, output_tokens: int = 0) -> None:
        """Count tokens computed for the request against its tenant."""
        key = fair_share_key(request)
        cost = prompt_tokens * self.prompt_token_cost + output_tokens * self.output_token_cost
        self.served[key] = self.served.get(key, 0.0) + cost
        self.virtual[key] = self.virtual.get(key, 0.0) + cost / self.weights.get(key, 1.0)

    def count_preemption(self, request: Request) -> None:
        """One of the request's sequences was preempted (KV pressure or a waiting request)."""
        key = fair_share_key(request)
        self.preempted[key] = self.preempted.get(key, 0) + 1

    def tenants(self) -> dict[str, dict]:
        """The active tenants as plain data: ``{key: {"service": virtual, "weight": w}}``."""
        return {
            key: {"service": self.virtual.get(key, 0.0), "weight": self.weights.get(key, 1.0)}
            for key in self._active
        }
