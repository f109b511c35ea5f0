"""Bounded polling on a condition for async tests: gateway_testlib.wait_until's counterpart
for a test whose condition must be awaited, or must not block the event loop it waits on.

The bound only guards against a hang (TESTING.md, "Tests do not wait on a clock"): it is
generous because it matters only when the test fails anyway, while CI runs the suite on two
workers on 2 cores, sometimes beside Ray clusters. A bound the project promises (a change
visible within a second) is a test of its own, never this default.
"""

from __future__ import annotations

import asyncio
import inspect

WAIT_S = 60.0


async def wait_until(condition, what: str, timeout: float = WAIT_S, every: float = 0.02):
    """Poll `condition()` (plain or async) until it is truthy and return its value; fail
    saying what never happened once `timeout` seconds have gone."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value = condition()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if loop.time() > deadline:
            raise AssertionError(f"gave up after {timeout:g} s waiting for {what}")
        await asyncio.sleep(every)
