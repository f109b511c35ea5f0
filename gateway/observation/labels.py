"""Bounded label values for per-adapter and per-tenant series.

With thousands of adapters, one series per adapter per metric would swamp Prometheus. The
rule: the first `limit` adapters (and, separately, tenants) that serve traffic get their
own label value, kept for the life of the process; every later one is counted under
`OTHER`. Why first-come and sticky rather than a moving top-K: a Prometheus counter must
never go down, and a name that moved between its own series and `OTHER` would make both
series jump (read as resets, so rate() lies). Under real traffic the busiest adapters
serve first, so the first `limit` are mostly the top ones; raise --metrics-label-limit to
see more, 0 to sum everything under `OTHER`. Names start with a letter or digit, so
`OTHER` and `BASE` never clash with one.
"""

from __future__ import annotations

import threading

OTHER = "__other__"
BASE = "__base__"  # requests for the base model, no adapter


class BoundedLabels:
    """`label(name)`: the name itself while fewer than `limit` names have one, else OTHER."""

    def __init__(self, limit: int):
        self.limit = limit
        self._named: set[str] = set()
        self._lock = threading.Lock()

    def label(self, name: str) -> str:
        if name == BASE:
            return BASE
        with self._lock:
            if name in self._named:
                return name
            if len(self._named) < self.limit:
                self._named.add(name)
                return name
            return OTHER

    def named(self) -> frozenset[str]:
        """The names that have a label of their own."""
        with self._lock:
            return frozenset(self._named)
