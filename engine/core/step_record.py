"""What each engine step ran, kept for tests and the benchmark: the proof of stall-free steps
is in these records (every running decode in every step, prompt chunks within the budget),
not in wall-clock time."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

MAX_RECORDS = 4096  # the newest steps; a long-running server keeps no more


@dataclass(frozen=True)
class StepRecord:
    index: int
    budget: int  # the token budget the scheduler had for this step
    prefill_tokens: int  # prompt tokens (chunks, recomputes) computed in this step
    prefill_chunks: tuple[tuple[int, int], ...]  # (seq_id, tokens) per prefilling sequence
    decode_seq_ids: tuple[int, ...]
    decodes_left_out: tuple[int, ...]  # running decodes not in the step and not preempted
    preempted_seq_ids: tuple[int, ...]
    ms: float  # wall time of the whole step: schedule, forward, sampling, outputs
    # Milliseconds of each phase: schedule, prepare (the batch's inputs), forward (the model
    # and its logits), sample, output (tokens appended, stops by token id, the records
    # handed to output processing; its detokenizing and stop strings run beside the step).
    phases: tuple[tuple[str, float], ...] = ()
    # Milliseconds between scheduling and preparing the batch lent to adapter loads
    # (adapters/pacing.py's LoadWindows); in neither `ms` nor `phases`.
    load_window_ms: float = 0.0
    # (seq_id, proposed tokens) of each decode that speculated: its proposal ran too.
    drafts: tuple[tuple[int, int], ...] = ()

    @property
    def num_tokens(self) -> int:
        return self.prefill_tokens + len(self.decode_seq_ids) + sum(k for _, k in self.drafts)


class StepClock:
    """The phases of one step, each the time since the lap before (on a GPU, the host's
    time: launches, not the kernels they queue)."""

    def __init__(self) -> None:
        self.laps: dict[str, float] = {}
        self._last = time.perf_counter()

    def lap(self, phase: str) -> None:
        now = time.perf_counter()
        self.laps[phase] = self.laps.get(phase, 0.0) + (now - self._last) * 1e3
        self._last = now

    def set_aside(self) -> float:
        """Milliseconds since the last lap, counted in no phase."""
        now = time.perf_counter()
        ms, self._last = (now - self._last) * 1e3, now
        return ms


class StepRecords(deque):
    """The newest MAX_RECORDS step records, oldest first."""

    def __init__(self) -> None:
        super().__init__(maxlen=MAX_RECORDS)

    def add(
        self,
        scheduled,
        budget: int,
        ms: float,
        clock: StepClock | None = None,
        load_window_ms: float = 0.0,
    ) -> StepRecord:
        index = self[-1].index + 1 if self else 0
        record = StepRecord(
            index=index,
            budget=budget,
            prefill_tokens=sum(s.num_new_tokens for s in scheduled.prefills),
            prefill_chunks=tuple((s.seq.seq_id, s.num_new_tokens) for s in scheduled.prefills),
            decode_seq_ids=tuple(s.seq.seq_id for s in scheduled.decodes),
            decodes_left_out=tuple(scheduled.decodes_left_out),
            preempted_seq_ids=tuple(s.seq_id for s in scheduled.preempted),
            ms=ms,
            phases=tuple(clock.laps.items()) if clock is not None else (),
            load_window_ms=load_window_ms,
            drafts=tuple((s.seq.seq_id, len(s.draft)) for s in scheduled.decodes if s.draft),
        )
        self.append(record)
        return record


def mark_scheduled(scheduled) -> None:
    """A request's queue time ends at the first step that runs any of its prompt."""
    now = time.monotonic()
    for item in scheduled.prefills:
        if item.seq.request.first_scheduled_time is None:
            item.seq.request.first_scheduled_time = now
