"""How an adapter load shares the cores with the engine's steps.

Reading, hashing and stacking adapter files runs beside the steps on the same few cores and
memory bus. While sequences run, it goes in chunks with a pause after each (`ratio` times the
chunk's own time): a load takes longer but slows a running step by a fraction of its cost
instead of all of it (measured on 2 cores: a 78 MB rank-64 load doubled the step it
overlapped; paced, it took about 1.3 s instead of 0.16 s and the step grew by a fifth). With
nothing running there is no step to protect, so the load goes at full speed: `busy` says
which, asked before every pause.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

CHUNK_BYTES = 4 * 2**20
PAUSE_RATIO = 8.0


def _always() -> bool:
    return True


@dataclass(frozen=True)
class LoadPacing:
    ratio: float = PAUSE_RATIO
    busy: Callable[[], bool] = _always  # whether steps are running that a load would slow
    sleep: Callable[[float], None] = time.sleep

    def active(self) -> bool:
        """Whether a load pauses now: steps run beside it and the pacing is on."""
        return self.ratio > 0 and self.busy()

    def pause_after(self, started: float) -> None:
        """Sleep `ratio` times the work done since `started`, if anything runs beside it."""
        if self.active():
            self.sleep((time.perf_counter() - started) * self.ratio)


ALWAYS_PACED = LoadPacing()  # a load whose caller cannot tell whether steps run
UNPACED = LoadPacing(ratio=0.0)
