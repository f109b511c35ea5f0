"""One engine replica in the fleet model: its adapter tiers and its continuous batching.

Tiers, as loragate's replica keeps them: a device slot (`slots` distinct adapters per
step), the CPU tier (`cpu_tier` adapters: Ray Serve's multiplexed LRU, which is also what
the router knows the replica holds), the replica's disk cache (adapters fetched from the
store once, never dropped), and the adapter store. A request whose adapter is not in the
CPU tier waits for one loader (FIFO) to bring it up, paced while steps run
(adapters/pacing.py: the load then takes one of its times measured beside a stepping
engine, drawn at random, where measured, else (1 + ratio) times its alone time); requests
for an adapter being loaded wait for that load. The scheduler admits waiting requests in
order within the token budget and `max_num_seqs`, as engine/core/scheduler.py does: one adapter
is copied into a slot per step (the others needing a copy wait for the next), and a
request whose adapter finds no slot free of running sequences blocks the adapter requests
behind it for that step.
"""

from __future__ import annotations

import random
from collections import OrderedDict, deque
from dataclasses import dataclass

from .figures import Figures


@dataclass(eq=False)
class Request:
    index: int
    arrival: float
    adapter: int
    replica: int = -1
    tier: str = ""  # where its adapter was when it reached the replica
    first_token: float = -1.0
    finished: float = -1.0
    remaining: int = 0


@dataclass
class Step:
    end: float
    prefills: list
    decodes: list


class Replica:
    def __init__(
        self,
        index: int,
        figures: Figures,
        output_len: int,
        input_len: int,
        from_store: bool,
        seed: int = 0,
    ):
        self.index = index
        self.rng = random.Random(seed * 7919 + index)  # draws of the measured step noise
        self.figures = figures
        self.cap = figures.capacity
        self.input_len, self.output_len = input_len, output_len
        self.from_store = from_store  # adapters come from the store, else from a local disk
        self.cpu: OrderedDict[int, None] = OrderedDict()
        self.disk: set[int] = set()
        self.slots: OrderedDict[int, None] = OrderedDict()  # least recently used first
        self.loading: dict[int, list[Request]] = {}
        self.load_queue: deque[int] = deque()
        self.loader_busy = False
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.step: Step | None = None
        self.in_flight = 0
        self.reported: set[int] = set()  # the ids the router last heard of
        self.report_due = False
        self.loads = {"store": 0, "disk": 0, "slot": 0}
        # Seconds of its disk loads, reading and pauses (the store's fetch not counted): what
        # the engine's `load_seconds` counts in a real replica.
        self.disk_load_s = 0.0

    # ---- a request arrives ---------------------------------------------------------------
    def accept(self, req: Request) -> bool:
        """Take the request; True when a load must start (the caller schedules it)."""
        req.replica = self.index
        self.in_flight += 1
        a = req.adapter
        if a in self.cpu:
            self.cpu.move_to_end(a)
            req.tier = "slot" if a in self.slots else "cpu"
            self.waiting.append(req)
            return False
        if a in self.loading:  # behind every load queued so far (Ray Serve's one lock)
            req.tier = "loading"
            self.loading[self.load_queue[-1] if self.load_queue else a].append(req)
            return False
        req.tier = "store" if self.from_store and a not in self.disk else "disk"
        self.loading[a] = [req]
        self.load_queue.append(a)
        return not self.loader_busy

    # ---- the loader ----------------------------------------------------------------------
    def start_load(self) -> tuple[int, float, int | None] | None:
        """The next adapter to load, its seconds, and the adapter the CPU tier drops for it
        (Ray Serve's multiplexed LRU drops its least recently used id before loading one
        more); None when nothing waits."""
        if not self.load_queue:
            self.loader_busy = False
            return None
        self.loader_busy = True
        a = self.load_queue.popleft()
        dropped = None
        if len(self.cpu) >= self.cap.cpu_tier:
            dropped, _ = self.cpu.popitem(last=False)
            if dropped in self.slots and dropped not in {r.adapter for r in self.running}:
                del self.slots[dropped]  # the replica drops the weights, slot and all
        ms = self.figures.load.disk_ms
        self.disk_load_s += ms / 1e3
        if self.from_store and a not in self.disk:
            ms += self.figures.load.store_ms
            self.loads["store"] += 1
        self.loads["disk"] += 1
        return a, ms / 1e3, dropped

    def pause_after_load(self) -> float:
        """Seconds the load takes past its alone work: paced while sequences run (the
        measured paced time, fleet/figures.py's `LoadTimes.paced_ms`)."""
        load = self.figures.load
        pause = (load.paced_ms(self.rng) - load.disk_ms) / 1e3 if self.running else 0.0
        self.disk_load_s += pause
        return pause

    def finish_load(self, a: int) -> list[Request]:
        """The adapter is in the CPU tier: its requests wait for the scheduler."""
        self.disk.add(a)
        self.cpu[a] = None
        reqs = self.loading.pop(a)
        self.waiting.extend(reqs)
        return reqs

    def model_ids(self) -> set[int]:
        """What the replica reports to Ray Serve: the ids loaded and being loaded."""
        return set(self.cpu) | set(self.loading)

    # ---- continuous batching -------------------------------------------------------------
    def plan_step(self, now: float) -> Step | None:
        if not self.waiting and not self.running:
            return None
        cap = self.cap
        busy = {r.adapter for r in self.running}
        budget = cap.token_budget - len(self.running)
        room = cap.max_num_seqs - len(self.running)
        prefills, skipped, blocked, slot_loads = [], deque(), False, 0
        while self.waiting and room > 0 and budget >= self.input_len:
            req = self.waiting.popleft()
            a = req.adapter
            if blocked or (a not in self.slots and slot_loads):  # one copy into a slot a step
                skipped.append(req)
                continue
            victim = self._free_slot(busy) if a not in self.slots else None
            if victim == -2:  # no slot free of running sequences: the rest wait a step
                blocked = True
                skipped.append(req)
                continue
            if victim is not None:
                if victim >= 0:
                    del self.slots[victim]
                self.slots[a] = None
                slot_loads += 1
            self.slots.move_to_end(a)
            busy.add(a)
            prefills.append(req)
            budget -= self.input_len
            room -= 1
        skipped.extend(self.waiting)
        self.waiting = skipped
        self.loads["slot"] += slot_loads
        ms = self.figures.step.ms(len(prefills) * self.input_len, len(self.running), len(busy))
        ms *= self.figures.step_scale
        if self.figures.step_noise:
            ms *= self.rng.choice(self.figures.step_noise)
        ms += slot_loads * self.figures.load.slot_ms
        self.step = Step(now + ms / 1e3, prefills, list(self.running))
        return self.step

    def _free_slot(self, busy: set[int]) -> int:
        """-1: a slot is empty; an adapter: the least recently used slot to evict; -2: none."""
        if len(self.slots) < self.cap.slots:
            return -1
        for a in self.slots:
            if a not in busy:
                return a
        return -2

    def finish_step(self) -> list[Request]:
        """Tokens out: first tokens for the step's prefills. Returns the requests done."""
        step, self.step = self.step, None
        done = []
        for req in step.prefills:
            req.first_token = step.end
            req.remaining = self.output_len - 1
            (self.running if req.remaining > 0 else done).append(req)
        for req in step.decodes:
            req.remaining -= 1
            if req.remaining <= 0:
                done.append(req)
        if done:
            gone = set(map(id, done))
            self.running = [r for r in self.running if id(r) not in gone]
        for req in done:
            req.finished = step.end
            self.in_flight -= 1
        return done
