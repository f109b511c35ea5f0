"""Continuous batching: each step, running decodes first, then swapped-out and waiting ones.

Limits per step: the token budget, the sequence cap, free KV blocks, and device adapter
slots. Stall-free (Sarathi-Serve): every running decode is in every step, and prompts are
split into chunks that fill what the budget leaves, so a burst of prompts never freezes the
streams already decoding. Waiting prompts go in the `admission_order` (the scheduling
policy's: shortest prefill first by default, fair shares between tenants with `fair`).
When blocks run out, a victim (the built-in plugin's choice, newest first, unless another
plugin says otherwise) is preempted: swapped to CPU, or dropped and recomputed
later. A request whose adapter weights are still loading (engine/lora/adapter_residency.py) waits
without holding up the others.

The step has vLLM V1's shape: `schedule()` returns one SchedulerOutput (what runs, the forks
of n > 1 that join it sharing their parent's blocks, the block tables changed since the
last step, copy-on-write pairs) for the runner to execute, and `update_from_output()` takes
the runner's output. The scheduler is the one writer of each sequence's computed tokens,
output tokens, stops and frees, and of the running list: beam search's decisions and the
stops output processing finds come through `fork`, `append_token` and `stop`
(tests/engine/test_step_ownership.py checks it).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Protocol

from loragate.engine.api.plugin_data import preemption_victim
from loragate.engine.core.admission_order import AdmissionOrder
from loragate.engine.core.beam_search import BeamSearchDriver
from loragate.engine.core.block_manager import BlockManager
from loragate.engine.core.sequence import Request, Sequence, SequenceStatus
from loragate.engine.core.swap import KVSwapper
from loragate.engine.lora.adapter_residency import AdapterNotReady
from loragate.engine.outputs.output_builder import record_failure
from loragate.engine.outputs.stopping import stop_by_token
from loragate.engine.speculation import Speculator
from loragate.plugins.builtin.preemption import newest_first_victim

# A sequence that started or resumed running fewer steps ago than this is not preempted for
# a waiting request (the hysteresis that keeps two tenants from trading places every step).
PROTECT_STEPS = 8


class AdapterSlots(Protocol):
    def acquire(self, request: Request, busy_slots: set[int]) -> int | None:
        """A slot, None while all are busy; AdapterNotReady while the weights load."""


@dataclass
class ScheduledSeq:
    seq: Sequence
    num_new_tokens: int
    # A fork (samples 2..n of a request) takes its parent's logits row this step: the
    # parent's tokens are computed once, and the fork shares their blocks.
    parent: Sequence | None = None
    # A decode that speculates: the proposed tokens run after its last one (counted in
    # num_new_tokens), and the step verifies them (engine/speculation/verify.py).
    draft: list[int] = field(default_factory=list)

    @property
    def samples(self) -> bool:
        """True when this step computes the sequence's last known token, so it samples."""
        known = self.num_new_tokens - len(self.draft)
        return self.seq.num_computed_tokens + known == self.seq.num_tokens


@dataclass
class SchedulerOutput:
    prefills: list[ScheduledSeq] = field(default_factory=list)
    decodes: list[ScheduledSeq] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    # Sequences whose adapter could not be put in a slot (files changed or gone since it
    # was registered): their requests fail alone, the step goes on without them.
    failed: list[tuple[Sequence, Exception]] = field(default_factory=list)
    # Running decodes that got no place in this step without being preempted: stall-free
    # scheduling keeps this empty (the step records show it).
    decodes_left_out: list[int] = field(default_factory=list)
    # Samples 2..n forked this step from a sequence whose prompt's last token runs in it.
    forks: list[ScheduledSeq] = field(default_factory=list)
    # The sequences whose block tables changed since the last step (one without blocks
    # gives its row of the persistent batch back), and copy-on-write (src, dst) blocks.
    changed_tables: dict[int, Sequence] = field(default_factory=dict)
    copies: list[tuple[int, int]] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.prefills and not self.decodes

    def add(self, seq: Sequence, n: int) -> None:
        is_decode = n == 1 and seq.num_computed_tokens > 0
        (self.decodes if is_decode else self.prefills).append(ScheduledSeq(seq, n))

    def drop(self, seq: Sequence) -> None:
        self.prefills = [s for s in self.prefills if s.seq is not seq]
        self.decodes = [s for s in self.decodes if s.seq is not seq]


class Scheduler:
    def __init__(
        self,
        block_manager: BlockManager,
        *,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        enable_chunked_prefill: bool = True,
        adapter_slots: AdapterSlots | None = None,
        swapper: KVSwapper | None = None,
        choose_preemption_victim: Callable[[list[Sequence]], Sequence] | None = None,
        admission_order: Callable[[list[Sequence]], list[Sequence]] | None = None,
        fair_share=None,
        eos_token_ids: Collection[int] = (),
        max_model_len: int | None = None,
        new_sequence: Callable[[Request, int], Sequence] | None = None,
        speculator: Speculator | None = None,
        preempt_for: Callable[[Sequence, list[Sequence], int], Sequence | None] | None = None,
    ):
        self.block_manager = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.enable_chunked_prefill = enable_chunked_prefill
        self.adapter_slots = adapter_slots
        self.swapper = swapper  # None: preemption recomputes
        self.choose_preemption_victim = choose_preemption_victim or preemption_victim(
            newest_first_victim
        )
        self.admission_order = admission_order or AdmissionOrder("fcfs")
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.swapped: deque[Sequence] = deque()
        self.num_preemptions = 0
        # What taking a token needs: the service per tenant it is charged to, and the
        # stops that token ids alone decide (engine/outputs/stopping.py).
        self.fair_share = fair_share
        self.eos_token_ids = eos_token_ids
        self.max_model_len = max_model_len
        self.beams = BeamSearchDriver(self, new_sequence)
        self.num_generation_tokens = 0
        self.speculator = speculator  # None: no speculative decoding
        # The policy's choice of a running sequence to preempt so the waiting head may run
        # when the batch is full (plugin_data.waiting_victim); None: never.
        self.preempt_for = preempt_for
        self.num_steps = 0
        self.num_fairness_preemptions = 0
        self._granted: dict[int, int] = {}  # this step's tokens per running sequence

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    # ---- after the step: the one writer of computed tokens, output tokens and stops ------
    def update_from_output(self, out: SchedulerOutput, result) -> list[Request]:
        """Advance what the step computed, take each sampled token (stopping by token id,
        EOS, max_tokens or the context limit), step beam groups, fail the requests whose
        sample failed (and those whose adapter could not take a slot); the requests this
        step touched, in order."""
        touched: dict[str, Request] = {}
        for seq, error in out.failed:  # they end here, alone
            self.fail(seq.request, error)
            touched[seq.request.request_id] = seq.request
        if self.fair_share is not None:
            for item in out.prefills:  # a recompute's tokens were charged the first time
                seq = item.seq
                end = seq.num_computed_tokens + item.num_new_tokens
                fresh = end - max(seq.num_computed_tokens, seq.charged_through)
                if fresh > 0:
                    self.fair_share.charge(seq.request, prompt_tokens=fresh)
        for item in out.prefills + out.decodes + out.forks:
            rejected = self._rejected(item, result) if item.draft else 0
            item.seq.num_computed_tokens += item.num_new_tokens - rejected
            item.seq.charged_through = max(item.seq.charged_through, item.seq.num_computed_tokens)
            if rejected:  # their KV is dropped with the blocks past what the row holds now
                self.block_manager.trim(item.seq, item.seq.num_computed_tokens + 1)
            self.block_manager.register_full_blocks(item.seq)
        if result.beams:
            self.beams.step(result.beams, touched)
        now = time.monotonic()
        for seq, sample in zip(result.sampled, result.samples, strict=True):
            touched[seq.request.request_id] = seq.request
            if isinstance(sample, Exception):
                self.fail(seq.request, sample)
                continue
            if seq.finished:  # its request failed through a sibling this step
                continue
            for token in sample if isinstance(sample, list) else (sample,):
                if seq.finished:  # stopped by a token before the last one it verified
                    break
                self._take(seq, token)
            if seq.request.first_token_time is None:
                seq.request.first_token_time = now
        return list(touched.values())

    def _rejected(self, item: ScheduledSeq, result) -> int:
        """How many of a speculating row's proposal tokens the target rejected (all, when
        its sample failed): its last token and the accepted ones count as computed, and
        the KV written for the rest is overwritten later."""
        seq = item.seq
        taken = next(
            (s for q, s in zip(result.sampled, result.samples, strict=True) if q is seq), None
        )
        accepted = len(taken) - 1 if isinstance(taken, list) else 0
        self.speculator.record(seq, len(item.draft), accepted)
        return len(item.draft) - accepted

    def _take(self, seq: Sequence, sample) -> None:
        """Take the sampled token; stop by token id, EOS, max_tokens or the context limit
        here (the text and stop strings are output processing's)."""
        seq.token_ids.append(sample.token_id)
        seq.charged_through = seq.num_tokens  # its charge below covers computing it later
        seq.unreported.append(sample)
        self.num_generation_tokens += 1
        if self.fair_share is not None:
            self.fair_share.charge(seq.request, output_tokens=1)
        if seq.cumulative_logprob is not None:
            seq.cumulative_logprob += sample.logprob
        decision = stop_by_token(
            seq.request.params,
            seq.num_tokens - seq.prompt_len,
            sample.token_id,
            self.eos_token_ids,
            seq.num_tokens,
            self.max_model_len,
        )
        if decision is not None:
            self.finish(seq, decision.finish_reason, decision.stop_reason)

    def append_token(self, seq: Sequence, token_id: int) -> None:
        """A token a decoding strategy chose for a beam (engine/core/beam_search.py)."""
        seq.token_ids.append(token_id)

    def stop(self, seq: Sequence, num_output_tokens: int, reason: str, stop_reason) -> None:
        """Finish a sample output processing stopped (a stop string, or text that failed),
        keeping the first `num_output_tokens` of its outputs."""
        if not seq.finished:
            del seq.token_ids[seq.prompt_len + num_output_tokens :]
            self.finish(seq, reason, stop_reason)

    def fail(self, request: Request, error: Exception) -> None:
        """Something failed for this request alone: finish it (freeing its KV blocks) and
        say why; the engine and every other request go on."""
        record_failure(request, error)
        self.finish_request(request, "error")
        request.pending_forks = []

    def finish_request(self, request: Request, reason: str) -> None:
        """Finish every sequence of the request still going (an abort, a failure)."""
        for seq in request.seqs:
            if not seq.finished:
                self.finish(seq, reason, None)

    def finish(self, seq: Sequence, reason: str, stop_reason=None) -> None:
        self.remove(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        seq.stop_reason = stop_reason

    def remove(self, seq: Sequence) -> None:
        """Drop a finished or aborted sequence and free its blocks."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        elif seq in self.swapped:
            self.swapped.remove(seq)
            self.swapper.release(seq)
        self.block_manager.free(seq)
        seq.lora_slot = -1

    def live_sequences(self) -> list[Sequence]:
        return self.running + list(self.waiting) + list(self.swapped)

    def schedule(self) -> SchedulerOutput:
        self.num_steps += 1
        out = SchedulerOutput()
        decoding = [s.seq_id for s in self.running if s.num_uncomputed_tokens == 1]
        drafts = self._drafts(self.max_num_batched_tokens)
        budget = self._schedule_running(out, self.max_num_batched_tokens, drafts)
        if not out.preempted:
            budget = self._schedule_swapped(out, budget)
            if not self.swapped:
                self._schedule_waiting(out, budget)
        placed = {s.seq.seq_id for s in out.decodes} | {s.seq_id for s in out.preempted}
        out.decodes_left_out = [i for i in decoding if i not in placed]
        self._fork_pending(out)
        out.changed_tables = self.block_manager.take_changed_tables()
        out.copies = self.block_manager.take_copies()
        return out

    def _fork_pending(self, out: SchedulerOutput) -> None:
        """Samples 2..n of a request join when its prompt's last token runs: they share its
        blocks and sample from its logits row (in the order the runner runs the step)."""
        items = sorted(out.prefills, key=slot_order) + sorted(out.decodes, key=slot_order)
        for item in items:
            parent = item.seq
            if not parent.request.pending_forks or not item.samples:
                continue
            for child in parent.request.pending_forks:
                self.fork(parent, child)
                out.forks.append(ScheduledSeq(child, item.num_new_tokens, parent))
            parent.request.pending_forks = []

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """A child copy of `parent` (its tokens so far) joins: sharing the parent's blocks
        and slot while the parent runs, or waiting to recompute them while it does not."""
        child.token_ids = list(parent.token_ids)
        child.charged_through = parent.charged_through  # the shared prompt is charged once
        child.cumulative_logprob = parent.cumulative_logprob
        if parent.status is not SequenceStatus.RUNNING:
            child.num_computed_tokens = 0
            self.add(child)
            return
        child.num_computed_tokens = parent.num_computed_tokens
        self.block_manager.fork(parent, child)
        child.lora_slot = parent.lora_slot
        child.status = SequenceStatus.RUNNING
        child.running_since = parent.running_since
        self.running.append(child)

    def _drafts(self, budget: int) -> dict[int, list[int]]:
        """Proposals for running decodes, in the room the step has to spare: the budget
        left after every decode and every prompt token still waiting to run (a step with
        prompt work is compute-bound already, and speculation would only delay it)."""
        if self.speculator is None:
            return {}
        decodes = [s for s in self.running if s.num_uncomputed_tokens == 1]
        pending = sum(s.num_uncomputed_tokens for s in self.running if s.num_uncomputed_tokens > 1)
        pending += sum(s.num_uncomputed_tokens for s in self.waiting)
        pending += sum(s.num_uncomputed_tokens for s in self.swapped)
        return self.speculator.drafts(decodes, budget - len(decodes) - pending)

    def _schedule_running(
        self, out: SchedulerOutput, budget: int, drafts: dict[int, list[int]]
    ) -> int:
        active = list(self.running)  # admission order: the victim policy sees it this way
        granted = self._granted = {}
        # Decodes first, then chunks of prompts still filling.
        for seq in sorted(self.running, key=lambda s: s.num_uncomputed_tokens > 1):
            if seq.status is not SequenceStatus.RUNNING:
                continue  # preempted earlier in this loop
            # A decode always runs (stall-free), even past the budget: forks of n > 1 can
            # make more running sequences than max_num_seqs, which the budget holds.
            n = 1 if seq.num_uncomputed_tokens == 1 else min(seq.num_uncomputed_tokens, budget)
            if n <= 0:
                continue
            while not self.block_manager.can_append(seq, n):
                victim = self.choose_preemption_victim(active)
                active.remove(victim)
                if victim.seq_id in granted:
                    budget += granted.pop(victim.seq_id)
                    out.drop(victim)
                self._preempt(victim, out)
                if victim is seq:
                    break
            else:
                draft = drafts.get(seq.seq_id) if n == 1 else None
                if draft and self.block_manager.can_append(seq, n + len(draft)):
                    # Its proposal runs too, where the blocks are free (never preempting).
                    n += len(draft)
                    self.block_manager.append_slot(seq, n)
                    out.decodes.append(ScheduledSeq(seq, n, draft=draft))
                else:
                    self.block_manager.append_slot(seq, n)
                    out.add(seq, n)
                granted[seq.seq_id] = n
                budget -= n
        self.running = active
        return budget

    def _schedule_swapped(self, out: SchedulerOutput, budget: int) -> int:
        while self.swapped and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.swapped[0]
            n = seq.num_uncomputed_tokens
            if n > budget or not self.swapper.can_swap_in(seq, n):
                break
            if seq.lora_request is not None:
                try:
                    slot = self._acquire_adapter_slot(seq)
                except AdapterNotReady:
                    break  # it swaps back in once a loader thread has read its weights
                except Exception as exc:  # the engine fails its request; remove() frees it
                    out.failed.append((seq, exc))
                    break
                if slot is None:
                    break
                seq.lora_slot = slot
            self.swapped.popleft()
            self.swapper.swap_in(seq)
            self.block_manager.append_slot(seq, n)
            seq.status = SequenceStatus.RUNNING
            seq.running_since = self.num_steps
            self.running.append(seq)
            out.add(seq, n)
            budget -= n
        return budget

    def _schedule_waiting(self, out: SchedulerOutput, budget: int) -> None:
        blocked_on_slot = False
        skipped: list[Sequence] = []
        for seq in self.waiting:  # once refused a slot, every step waited counts
            if seq.slot_wait_steps:
                seq.slot_wait_steps += 1
        if len(self.waiting) > 1:
            self.waiting = deque(self.admission_order(list(self.waiting)))
        while self.waiting:
            seq = self.waiting[0]
            if budget <= 0 or len(self.running) >= self.max_num_seqs:
                refund = self._make_room(seq, out)
                if refund is None:
                    break
                budget += refund
                continue
            hit = self.block_manager.lookup_prefix(seq)  # changes nothing until allocate
            n = seq.num_uncomputed_tokens - hit.num_tokens
            if n > budget and not self.enable_chunked_prefill:
                break
            n = min(n, budget)
            if not self.block_manager.can_allocate(seq, n, hit):
                refund = self._make_room(seq, out)
                if refund is None:
                    break
                budget += refund
                continue
            if seq.lora_request is not None:
                # Once one request waits for a slot, no later adapter request may take one
                # first, so busy slots drain between requests (the flooding tenant's too)
                # and it gets one; base-model requests need no slot and go on.
                try:
                    slot = None if blocked_on_slot else self._acquire_adapter_slot(seq)
                except AdapterNotReady:  # loading off the step: the others go on
                    # ...but none takes a slot first once this one was refused one (a slot
                    # freed for it stays free while its weights load).
                    blocked_on_slot = blocked_on_slot or seq.slot_wait_steps > 0
                    skipped.append(self.waiting.popleft())
                    continue
                except Exception as exc:  # this request's adapter alone: it fails alone
                    skipped.append(self.waiting.popleft())
                    out.failed.append((seq, exc))
                    continue
                if slot is None and not blocked_on_slot:
                    refund = self._free_adapter_slot(seq, out)
                    if refund is not None:
                        budget += refund
                        seq.slot_wait_steps = seq.slot_wait_steps or 1
                        continue  # a slot is free now: `seq` again
                if slot is None:
                    blocked_on_slot = True
                    seq.slot_wait_steps = seq.slot_wait_steps or 1  # admission order bounds it
                    skipped.append(self.waiting.popleft())
                    continue
                seq.lora_slot = slot
            self.waiting.popleft()
            self.block_manager.allocate(seq, n, hit)  # takes the prefix hit's blocks
            seq.num_computed_tokens = hit.num_tokens  # and their tokens count as computed
            seq.status = SequenceStatus.RUNNING
            seq.running_since = self.num_steps
            self.running.append(seq)
            out.add(seq, n)
            budget -= n
        self.waiting.extendleft(reversed(skipped))

    def _make_room(self, seq: Sequence, out: SchedulerOutput) -> int | None:
        """The batch is full (sequences, KV blocks or the token budget) for the waiting
        head `seq`: preempt the running sequence the policy gives up for it, if any. It
        keeps its place (right behind `seq`) and its full blocks stay in the prefix cache
        for its recompute; the tokens it was granted this step are returned (None: none)."""
        if self.preempt_for is None or not self.running:
            return None
        victim = self.preempt_for(seq, self.running, self.num_steps)
        if victim is None:
            return None
        return self._give_up(victim, out)

    def _free_adapter_slot(self, seq: Sequence, out: SchedulerOutput) -> int | None:
        """Every adapter slot is busy for the waiting head `seq`: free one, when the policy
        gives up for `seq` a sequence holding a slot and every other sequence holding that
        slot too (so one tenant's adapters cannot keep the slots from a tenant owed
        service). The tokens they were granted this step are returned (None: none freed)."""
        if self.preempt_for is None:
            return None
        holders = [s for s in self.running if s.lora_slot >= 0]
        victim = self.preempt_for(seq, holders, self.num_steps) if holders else None
        if victim is None:
            return None
        group = [s for s in holders if s.lora_slot == victim.lora_slot]
        if any(self.preempt_for(seq, [s], self.num_steps) is not s for s in group):
            return None
        return sum(self._give_up(s, out) for s in group)

    def _give_up(self, victim: Sequence, out: SchedulerOutput) -> int:
        """Preempt `victim` for the waiting head; the tokens it was granted this step."""
        refund = self._granted.pop(victim.seq_id, 0)
        out.drop(victim)
        self.running.remove(victim)
        self._preempt(victim, out)
        self.num_fairness_preemptions += 1
        if victim.status is SequenceStatus.WAITING:
            self.waiting.remove(victim)
            self.waiting.insert(1, victim)
        return refund

    def busy_adapter_slots(self) -> set[int]:
        """The adapter slots running sequences use: never evicted or cleared under them."""
        return {s.lora_slot for s in self.running if s.lora_slot >= 0}

    def _acquire_adapter_slot(self, seq: Sequence) -> int | None:
        if self.adapter_slots is None:
            raise ValueError("a LoRA request was scheduled but LoRA is not enabled")
        busy = self.busy_adapter_slots()
        # The weights it was admitted under, whatever its files hold by now.
        return self.adapter_slots.acquire(seq.request, busy)

    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> None:
        """Swap the victim's KV to CPU when a swapper has room; otherwise drop and recompute."""
        seq.lora_slot = -1
        out.preempted.append(seq)
        self.num_preemptions += 1
        if self.fair_share is not None:
            self.fair_share.count_preemption(seq.request)
        if self.swapper is not None and self.swapper.can_swap_out(seq):
            self.swapper.swap_out(seq)
            seq.status = SequenceStatus.SWAPPED
            self.swapped.append(seq)
            return
        self.block_manager.free(seq)
        seq.num_computed_tokens = 0
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)


def slot_order(item: ScheduledSeq) -> float:
    """The runner's order within prefills and within decodes: by adapter slot, base last."""
    slot = item.seq.lora_slot
    return slot if slot >= 0 else float("inf")
