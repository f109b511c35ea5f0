"""How an adapter load shares the cores with the engine's steps.

Reading, hashing and stacking adapter files runs beside the steps on the same few cores and
memory bus. While sequences run, it goes in chunks with a pause after each (`ratio` times the
CPU time the chunk took): a load takes longer but slows a running step by a fraction of its
cost instead of all of it (measured on 2 cores: a 78 MB rank-64 load doubled the step it
overlapped; paced, it took about 1.3 s instead of 0.16 s and the step grew by a fifth). With
nothing running there is no step to protect, so the load goes at full speed: `busy` says
which, asked before every pause.

The pause is a multiple of the loader thread's own CPU time (`time.thread_time`), not of the
chunk's wall time: beside a step whose threads fill every core, the loader runs a third of
the time it is ready, so a pause of 8x its wall time left it a twenty-seventh of a core,
not a ninth (a rank-64 load took 5.4-7.1 s through the async engine, 30-70x its 100-200 ms
of work; 2-core AMD EPYC, 2026-11-28). The steps are slowed by the CPU time a load takes,
which is what the pause is measured against.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

CHUNK_BYTES = 4 * 2**20
PAUSE_RATIO = 8.0
# Items of a Python loop (a file's hundreds of tensors parsed and checked) between pauses:
# about half a millisecond of work holding the GIL.
ITEMS_PER_PAUSE = 16


def _always() -> bool:
    return True


@dataclass(frozen=True)
class LoadPacing:
    ratio: float = PAUSE_RATIO
    busy: Callable[[], bool] = _always  # whether steps are running that a load would slow
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.thread_time  # the loading thread's own CPU time

    def now(self) -> float:
        """Where a chunk of work starts, for `pause_after` (the thread's CPU time)."""
        return self.clock()

    def active(self) -> bool:
        """Whether a load pauses now: steps run beside it and the pacing is on."""
        return self.ratio > 0 and self.busy()

    def pause_after(self, started: float) -> None:
        """Sleep `ratio` times the CPU time this thread spent since `started` (`now()`), if
        anything runs beside it."""
        if self.active():
            self.sleep(max(0.0, self.clock() - started) * self.ratio)

    def paced(self, items: Iterable, every: int = ITEMS_PER_PAUSE) -> Iterator:
        """``items``, with a pause (`pause_after`) after every ``every`` of them. A load's
        Python loops hold the GIL, and a step's thread takes it back after each of its
        hundreds of torch ops: while another thread's loop runs, each of those waits up to
        the interpreter's switch interval (5 ms), so a 25 ms loop over a file's tensors made
        a decode step 1.5-4x its median (2-core EPYC, 2026-11-27). The pauses hand it
        back in time."""
        began = self.now()
        for count, item in enumerate(items, 1):
            yield item
            if count % every == 0:
                self.pause_after(began)
                began = self.now()


ALWAYS_PACED = LoadPacing()  # a load whose caller cannot tell whether steps run
UNPACED = LoadPacing(ratio=0.0)
