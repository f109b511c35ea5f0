"""What the check run's replicas did, recorded inside them: every engine step (wall clock,
milliseconds, prompt tokens, running sequences, distinct adapters), every adapter load
through Ray Serve's multiplexed path (the engine's read, and the wait before it), and each
request's times on the replica (arrived, its adapter resident, first token out).

Benchmark-only instrumentation: Ray runs `install` in every worker process it starts
(`runtime_env={"worker_process_setup_hook": ...}`), which wraps three methods to append one
JSON line per event to `$FLEET_TRACE_DIR/<pid>.jsonl`. Nothing in loragate changes. The
clock is `time.time()`, shared by the processes of one machine, so a request's times on
the replica line up with the client's.
"""

from __future__ import annotations

import contextvars
import json
import os
import time
from pathlib import Path

TRACE_DIR_ENV = "FLEET_TRACE_DIR"
_request: contextvars.ContextVar[dict | None] = contextvars.ContextVar("fleet_req", default=None)


class _Log:
    def __init__(self, root: str) -> None:
        self.path = Path(root) / f"{os.getpid()}.jsonl"
        self.file = None

    def write(self, **event) -> None:
        if self.file is None:
            self.file = self.path.open("a", buffering=1)
        self.file.write(json.dumps(event) + "\n")


def install() -> None:
    """Wrap the engine's step record, the replica's generate and its adapter load."""
    root = os.environ.get(TRACE_DIR_ENV)
    if not root:
        return
    from loragate.engine.api.async_engine import AsyncLLMEngine
    from loragate.engine.core.llm_engine import LLMEngine
    from loragate.gateway.replicas.engine_replica import EngineReplica

    if getattr(LLMEngine, "_fleet_traced", False):
        return
    LLMEngine._fleet_traced = True
    log = _Log(root)
    record_step = LLMEngine._record_step

    def _record_step(self, scheduled, ms, clock, window_ms=0.0):
        items = scheduled.prefills + scheduled.decodes
        names = {i.seq.request.lora_request.lora_name for i in items if i.seq.request.lora_request}
        log.write(
            kind="step",
            t=time.time(),
            ms=ms,
            prefill=sum(i.num_new_tokens for i in scheduled.prefills),
            decodes=len(scheduled.decodes),
            adapters=len(names),
        )
        return record_step(self, scheduled, ms, clock, window_ms)

    generate = EngineReplica.generate

    async def _generate(self, call):
        times = {"arrived": time.time()}
        _request.set(times)
        first = True
        async for out in generate(self, call):
            if first:
                first = False
                times["first"] = time.time()
                log.write(kind="request", id=str(call.request_id), **times)
            yield out

    make_resident = EngineReplica._make_resident

    async def _make_resident(self, lora):
        await make_resident(self, lora)
        times = _request.get()
        if times is not None:
            times["resident"] = time.time()

    add_adapter = AsyncLLMEngine.add_adapter

    async def _add_adapter(self, lora_request, timeout=None):
        t0 = time.time()
        out = await add_adapter(self, lora_request, timeout)
        log.write(kind="load", name=lora_request.lora_name, start=t0, end=time.time())
        return out

    LLMEngine._record_step = _record_step
    EngineReplica.generate = _generate
    EngineReplica._make_resident = _make_resident
    AsyncLLMEngine.add_adapter = _add_adapter


def read(root: Path) -> dict[str, list[dict]]:
    """Every recorded event by kind, each with its process id (`pid`), in time order."""
    out: dict[str, list[dict]] = {"step": [], "request": [], "load": []}
    for path in sorted(Path(root).glob("*.jsonl")):
        for line in path.read_text().splitlines():
            event = json.loads(line)
            out[event.pop("kind")].append(event | {"pid": int(path.stem)})
    for events in out.values():
        events.sort(key=lambda e: e.get("t", e.get("start", e.get("arrived", 0.0))))
    return out
