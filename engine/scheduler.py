"""Continuous batching: each step, running sequences first, then waiting ones join.

Limits per step: the token budget, the sequence cap, free KV blocks, and device adapter
slots. When blocks run out, the newest running sequence is preempted by recompute.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from loragate.adapters import LoRARequest
from loragate.engine.block_manager import BlockManager
from loragate.engine.sequence import Sequence, SequenceStatus


class AdapterSlots(Protocol):
    def acquire(self, request: LoRARequest, busy_slots: set[int]) -> int | None: ...


@dataclass
class ScheduledSeq:
    seq: Sequence
    num_new_tokens: int

    @property
    def samples(self) -> bool:
        """True when this step computes the sequence's last known token, so it samples."""
        return self.seq.num_computed_tokens + self.num_new_tokens == self.seq.num_tokens


@dataclass
class SchedulerOutput:
    prefills: list[ScheduledSeq] = field(default_factory=list)
    decodes: list[ScheduledSeq] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.prefills and not self.decodes


def newest_first(running: list[Sequence]) -> Sequence:
    return running[-1]


class Scheduler:
    def __init__(
        self,
        block_manager: BlockManager,
        *,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        enable_chunked_prefill: bool = True,
        adapter_slots: AdapterSlots | None = None,
        choose_preemption_victim: Callable[[list[Sequence]], Sequence] = newest_first,
    ):
        self.block_manager = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.enable_chunked_prefill = enable_chunked_prefill
        self.adapter_slots = adapter_slots
        self.choose_preemption_victim = choose_preemption_victim
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def remove(self, seq: Sequence) -> None:
        """Drop a finished or aborted sequence and free its blocks."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.block_manager.free(seq)
        seq.lora_slot = -1

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self._schedule_running(out, self.max_num_batched_tokens)
        if not out.preempted:
            self._schedule_waiting(out, budget)
        return out

    def _schedule_running(self, out: SchedulerOutput, budget: int) -> int:
        still_running = []
        queue = deque(self.running)
        while queue:
            seq = queue.popleft()
            n = min(seq.num_uncomputed_tokens, budget)
            if n == 0:
                still_running.append(seq)
                continue
            while not self.block_manager.can_append(seq, n):
                victims = still_running + list(queue) + [seq]
                victim = self.choose_preemption_victim(victims)
                if victim is seq:
                    self._preempt(seq, out)
                    seq = None
                    break
                if victim in queue:
                    queue.remove(victim)
                else:
                    still_running.remove(victim)
                    self._unschedule(victim, out)
                self._preempt(victim, out)
            if seq is None:
                continue
            self.block_manager.append_slot(seq, n)
            scheduled = ScheduledSeq(seq, n)
            (out.decodes if n == 1 and seq.num_computed_tokens > 0 else out.prefills).append(
                scheduled
            )
            still_running.append(seq)
            budget -= n
        self.running = still_running
        return budget

    def _schedule_waiting(self, out: SchedulerOutput, budget: int) -> None:
        blocked_on_slot = False
        skipped: list[Sequence] = []
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            n = seq.num_uncomputed_tokens
            if n > budget:
                if not self.enable_chunked_prefill:
                    break
                n = budget
            if not self.block_manager.can_allocate(seq, n):
                break
            if seq.lora_request is not None:
                # Once one request waits for a slot, no later adapter request may take one
                # first (FCFS among them); base-model requests need no slot and go on.
                slot = None if blocked_on_slot else self._acquire_slot(seq)
                if slot is None:
                    blocked_on_slot = True
                    skipped.append(self.waiting.popleft())
                    continue
                seq.lora_slot = slot
            self.waiting.popleft()
            self.block_manager.allocate(seq, n)
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            out.prefills.append(ScheduledSeq(seq, n))
            budget -= n
        self.waiting.extendleft(reversed(skipped))

    def _acquire_slot(self, seq: Sequence) -> int | None:
        if self.adapter_slots is None:
            raise ValueError("a LoRA request was scheduled but LoRA is not enabled")
        busy = {s.lora_slot for s in self.running if s.lora_slot >= 0}
        return self.adapter_slots.acquire(seq.lora_request, busy)

    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> None:
        """Recompute preemption: drop the KV, keep the tokens, requeue at the front."""
        self.block_manager.free(seq)
        seq.num_computed_tokens = 0
        seq.lora_slot = -1
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)
        out.preempted.append(seq)
        self.num_preemptions += 1

    @staticmethod
    def _unschedule(seq: Sequence, out: SchedulerOutput) -> None:
        out.prefills = [s for s in out.prefills if s.seq is not seq]
        out.decodes = [s for s in out.decodes if s.seq is not seq]
