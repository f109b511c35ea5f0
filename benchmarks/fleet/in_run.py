"""The model's figures as the check run's own replicas measured them (its trace, from
fleet/check_run.py): the step time fitted on the replicas' step records in that run, the
spread of those steps about the fit, and the spread of each request's ingress overhead (the
way from the client to its replica and of the first token back). So the model runs on the
machine's conditions of the very run it is compared with, not on those of another hour.

Nothing here looks at a TTFT: the step records are the engine's, the overhead is the time
outside the replica, and the model still has to queue the requests behind steps and loads.
"""

from __future__ import annotations

import numpy as np

from .measure import fit_non_negative

QUANTILES = 100  # points kept of each spread


def spread(values, points: int = QUANTILES) -> list[float]:
    """`values` at `points` evenly spaced quantiles (the midpoints of equal-mass bins), so
    that drawing one of them at random follows the measured distribution."""
    q = (np.arange(points) + 0.5) / points
    return [round(float(v), 4) for v in np.quantile(np.asarray(values, dtype=float), q)]


def step_figures(steps: list[dict]) -> dict:
    """The fit of step time on prompt tokens, running sequences and distinct adapters, its
    median error, and each step's time over the fit's (its spread)."""
    x = np.array([[1.0, s["prefill"], s["decodes"], s["adapters"]] for s in steps])
    y = np.array([s["ms"] for s in steps])
    coef = fit_non_negative(x, y)
    ratio = y / (x @ coef)
    keys = ("base_ms", "per_prefill_token_ms", "per_decode_seq_ms", "per_adapter_ms")
    return {
        "step": {k: round(float(c), 4) for k, c in zip(keys, coef, strict=True)},
        "steps": len(steps),
        "fit_median_relative_error": round(float(np.median(np.abs(ratio - 1))), 3),
        "step_noise": spread(ratio),
    }


def overhead_ms(trace: dict) -> list[float]:
    """Each request's time outside its replica before its first token: client to the
    replica's `generate`, and the replica's first output back to the client (ms)."""
    on_replica = {r["id"]: r for r in trace["request"]}
    out = []
    for c in trace["client"]:
        r = on_replica.get(c["id"])
        if r is not None and "first" in c:
            out.append(((r["arrived"] - c["sent"]) + (c["first"] - r["first"])) * 1e3)
    return out


def figures_of(trace: dict) -> dict:
    """What fleet/check.py gives the model for one policy's run."""
    loads = [(e["end"] - e["start"]) * 1e3 for e in trace["load"]]
    over = overhead_ms(trace)
    return step_figures(trace["step"]) | {
        "overhead_ms_median": round(float(np.median(over)), 2),
        "overhead_spread_ms": spread(over),
        "requests_traced": len(over),
        # The engine's adapter loads in the run (reading, pacing): a cross-check of the
        # model's own load time, which it takes from fleet/measure.py, not from here.
        "load_ms_median": round(float(np.median(loads)), 1) if loads else None,
        "loads_traced": len(loads),
    }
