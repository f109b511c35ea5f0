"""Third-party plugins for the gateway tests: samplers that pick the runner-up token, that
fail, and that step only when the test allows (in the test's process, or through Redis in a
gateway of its own); a beam search that fails on one request."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from typing import TypeVar

import redis
import torch

from loragate.plugins.builtin.beam_search import BeamSearch
from loragate.plugins.markers import hookimpl

T = TypeVar("T")


def runner_up(logits: torch.Tensor, args: list[dict]) -> torch.Tensor:
    return torch.topk(logits, 2, dim=-1).indices[:, 1]


class RunnerUpPlugin:
    @hookimpl
    def loragate_samplers(self):
        return {"runner_up": runner_up}


EXPLODING_SEED = 666  # a request with this seed gets the failing logits processor


def explode(logits: torch.Tensor, args: list[dict]) -> torch.Tensor:
    raise RuntimeError("the explode sampler always fails")


def explode_logits(output_token_ids, logits):
    raise RuntimeError("the explode logits processor always fails")


class ExplodingPlugin:
    """A sampler, and a logits processor (for seed 666), that raise: the request that uses
    one fails alone."""

    @hookimpl
    def loragate_samplers(self):
        return {"explode": explode}

    @hookimpl
    def loragate_logits_processors(self, params):
        return [explode_logits] if params.get("seed") == EXPLODING_SEED else []


GATE_URL_ENV = "LORAGATE_TEST_GATE_REDIS_URL"
GATE_KEY_ENV = "LORAGATE_TEST_GATE_KEY"


class RelayedGatePlugin:
    """GatedPlugin's gate for a gateway in another process, its permits given through Redis
    (`RelayedGate`, at the Redis and key that `GATE_URL_ENV` and `GATE_KEY_ENV` name). Each
    sampling step pushes what it holds to `<key>:held` (each row's `stream`, from its
    sampler_args, and `step`, the tokens it has produced so far), then waits for a permit on
    `<key>:permits`. A step given none within `wait_s` fails its requests rather than hang
    the gateway."""

    def __init__(self, wait_s: float = 60.0):
        self._redis = redis.Redis.from_url(os.environ[GATE_URL_ENV])
        self._key = os.environ[GATE_KEY_ENV]
        self._wait_s = wait_s

    def relayed_greedy(self, logits: torch.Tensor, args: list[dict]) -> torch.Tensor:
        held = [(row.get("stream"), row["step"]) for row in args]
        self._redis.rpush(f"{self._key}:held", json.dumps(held))
        if self._redis.blpop([f"{self._key}:permits"], timeout=self._wait_s) is None:
            raise RuntimeError("relayed_greedy: the test gave this step no permit")
        return torch.argmax(logits, dim=-1)

    @hookimpl
    def loragate_samplers(self):
        return {"relayed_greedy": self.relayed_greedy}


class RelayedGate:
    """The test's end of RelayedGatePlugin: `env` for the gateway's process, `held` for the
    next step held there (stream -> tokens it has produced so far), `allow` to let it run."""

    def __init__(self, redis_url: str, key: str, wait_s: float = 60.0):
        self._redis = redis.Redis.from_url(redis_url)
        self._key = key
        self._wait_s = wait_s
        self.env = {GATE_URL_ENV: redis_url, GATE_KEY_ENV: key}
        self.given = 0  # permits given so far

    def held(self) -> dict[int, int]:
        popped = self._redis.blpop([f"{self._key}:held"], timeout=self._wait_s)
        if popped is None:
            raise AssertionError(f"no relayed step was held within {self._wait_s} s")
        return dict(json.loads(popped[1]))

    def allow(self, steps: int) -> None:
        self._redis.rpush(f"{self._key}:permits", *[1] * steps)
        self.given += steps


class GatedPlugin:
    """Greedy, but each sampling step waits for a permit the test gives (`allow`): a
    stream that cannot end before the test lets it, however fast or loaded the machine.
    A step given no permit within `wait_s` fails its request rather than hang the test.

    A request reaches the engine thread only between two steps, so a probe that needs it
    (a completion, /metrics) is run by `answer`, which gives the gated requests one step at
    a time until the probe is answered, never as many as a stream needs to end. `open`
    lets every later step through (the test is done holding them). `passed` counts the
    steps let through, `waiting` the steps held now, and `wait_for_a_held_step` returns
    once one is held (the engine thread inside a step)."""

    def __init__(self, wait_s: float = 60.0):
        self._ready = threading.Condition()
        self._permits = 0
        self._open = False
        self._wait_s = wait_s
        self.given = 0  # permits given so far: no gated request has taken more steps
        self.passed = 0  # steps let through
        self.waiting = 0  # steps held at the gate now

    def allow(self, steps: int) -> None:
        with self._ready:
            self._permits += steps
            self.given += steps
            self._ready.notify_all()

    def open(self) -> None:
        with self._ready:
            self._open = True
            self._ready.notify_all()

    def wait_for_a_held_step(self) -> None:
        with self._ready:
            if not self._ready.wait_for(lambda: self.waiting, self._wait_s):
                raise AssertionError(f"no gated step was held within {self._wait_s} s")

    def answer(self, probe: Callable[[], T], short_of: int) -> T:
        """`probe()`, run on a thread while the gated requests are given one step at a time
        until it returns, never `short_of` permits in all: a stream that needs `short_of`
        steps is still running when the probe is answered. Where the probe needs more, the
        gate opens (so the probe's thread can end) and the test fails. The polls between
        steps lengthen (50 ms for the first ten, up to 0.5 s), so a stream of 60 steps
        waits about 10 s for a probe on a loaded machine; most are answered within a step."""
        pool = ThreadPoolExecutor(1)
        try:
            pending = pool.submit(probe)
            steps = 0
            while not wait([pending], timeout=min(0.5, 0.05 * (1 + steps // 10))).done:
                if self.given >= short_of - 1:
                    self.open()
                    raise AssertionError(
                        f"the probe was not answered within {steps} steps, while a stream "
                        f"of {short_of} steps ran"
                    )
                self.allow(1)
                steps += 1
            return pending.result()
        finally:
            pool.shutdown(wait=False)  # a failed probe's thread ends on its own

    def gated_greedy(self, logits: torch.Tensor, args: list[dict]) -> torch.Tensor:
        with self._ready:
            self.waiting += 1
            self._ready.notify_all()
            try:
                let_through = self._ready.wait_for(
                    lambda: self._open or self._permits, self._wait_s
                )
            finally:
                self.waiting -= 1
            if not let_through:
                raise RuntimeError("gated_greedy: the test gave this step no permit")
            if not self._open:
                self._permits -= 1
            self.passed += 1
        return torch.argmax(logits, dim=-1)

    @hookimpl
    def loragate_samplers(self):
        return {"gated_greedy": self.gated_greedy}


OVERFLOWING_LENGTH_PENALTY = 2.5  # a beam request with this length_penalty fails mid-search


class _OverflowingBeamSearch(BeamSearch):
    def step(self, state, logprobs):
        if state.length_penalty == OVERFLOWING_LENGTH_PENALTY:
            raise OverflowError("(34, 'Numerical result out of range')")
        return super().step(state, logprobs)


class OverflowingBeamPlugin:
    """Beam search that raises on the engine thread, as the built-in one once did for
    length_penalty=1e308: only the request that hits it may fail."""

    @hookimpl
    def loragate_decoding_strategies(self):
        return {"beam": _OverflowingBeamSearch()}


class TenantObserver:
    """Records the tenant each finished request names (one shared instance, so the test
    that starts a server with it can read what the engine told it)."""

    def __init__(self) -> None:
        self.tenants: list[str | None] = []

    @hookimpl
    def loragate_request_finished(self, info):
        self.tenants.append(info["tenant"])


TENANT_OBSERVER = TenantObserver()


class AdmissionObserver:
    """Records what the admission-order hook is told (the waiting entries and the tenants'
    counters and weights) and leaves the order to the built-ins."""

    def __init__(self) -> None:
        self.entries: list[dict] = []
        self.tenants: list[dict] = []

    @hookimpl
    def loragate_order_waiting(self, waiting, tenants, policy):
        self.entries.extend(waiting)
        self.tenants.append({**tenants, "policy": policy})
        return None


ADMISSION_OBSERVER = AdmissionObserver()
