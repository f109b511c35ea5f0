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

Inside the engine the pauses are turns (`LoadWindows`): between two steps, while a load waits,
the engine thread lends the machine to the loads for half the median step's time and
waits. A load then runs alone, on every core and without sharing the caches, the memory bus
or the GIL with a step, and the steps run alone between windows. Beside concurrent pacing
this trades a longer gap for the streams while a load lasts (one step plus half of one)
for a load that ends many times sooner: on a 2-core AMD EPYC (2026-11-28, float32, 8
streams decoding) a paced rank-64 load took 2.5-5.7 s beside the steps, 30 times its
unpaced work, and slowed them by an eighth all that time. A loader that waits for a window
longer than MAX_PARK_S (a step that long is a long prompt's chunk) pauses by the ratio and
goes on beside it.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

CHUNK_BYTES = 4 * 2**20
PAUSE_RATIO = 8.0
# Items of a Python loop (a file's hundreds of tensors parsed and checked) between pauses:
# about half a millisecond of work holding the GIL.
ITEMS_PER_PAUSE = 16
# A window between two steps lasts this share of the median step's time: the streams' gap
# while a load waits is then one and a half steps, within issue 47's bound of twice their
# median.
WINDOW_SHARE = 0.5
MAX_PARK_S = 0.5
STEPS_MEDIAN = 15  # the window is a share of the median of this many last steps


def _always() -> bool:
    return True


class LoadWindows:
    """Turns at the machine between the engine's steps and the loads beside them.

    A loading thread, at each pause of its load, goes on at once while a window is open and
    otherwise parks (`take_turn`). The engine thread tells it each step's time (`observe`)
    and, between two steps, lends a window while any load is parked (`lend`): it opens one
    for ``share`` of the median of the last steps and waits until it closes or every load
    in it has ended. Loads count from `loading` to its end, so a window ends as soon as the
    last of them does. The median, not the last step: after a long step (a prompt's chunk)
    a window as long would make the next short step's gap as long again."""

    def __init__(
        self,
        share: float = WINDOW_SHARE,
        max_park: float = MAX_PARK_S,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.share = share
        self.max_park = max_park
        self._clock = clock
        self._cond = threading.Condition()
        self._open_until = float("-inf")
        self._loads = 0  # loads under way (inside `loading`)
        self._parked = 0  # of those, waiting for a window
        self._steps: deque[float] = deque(maxlen=STEPS_MEDIAN)
        self._inside = threading.local()  # whether the calling thread is inside `loading`
        self.lent = 0  # windows opened, for tests and the stats
        self.lent_seconds = 0.0  # their planned length, summed

    @contextmanager
    def loading(self) -> Iterator[None]:
        """One load under way on the calling thread, from its start to its end."""
        with self._cond:
            self._loads += 1
        depth = getattr(self._inside, "depth", 0)
        self._inside.depth = depth + 1
        try:
            yield
        finally:
            self._inside.depth = depth
            with self._cond:
                self._loads -= 1
                self._cond.notify_all()

    def _open(self) -> bool:
        return self._clock() < self._open_until

    def take_turn(self, busy: Callable[[], bool]) -> bool:
        """At a load's pause: True at once inside an open window, or once one opens; True
        as soon as nothing runs beside the load (``busy`` false); False after
        ``max_park`` s with no window (the steps are long: the caller pauses its own way),
        and at once on a thread outside `loading` (a window closes when the loads end, so
        it could never count on one)."""
        if not getattr(self._inside, "depth", 0):
            return False
        with self._cond:
            if self._open():
                return True
            self._parked += 1
            self._cond.notify_all()
            deadline = self._clock() + self.max_park
            try:
                while not self._open():
                    if not busy():
                        return True
                    left = deadline - self._clock()
                    if left <= 0:
                        return False
                    # woken by `lend`; the timeout looks at `busy` again (steps may end)
                    self._cond.wait(min(left, 0.01))
                return True
            finally:
                self._parked -= 1

    def observe(self, step_seconds: float) -> None:
        """A step took ``step_seconds`` (its own work: no window in it)."""
        if step_seconds > 0:
            self._steps.append(step_seconds)

    def lend(self) -> float:
        """Between two steps, on the engine thread: where a load is parked, open a window of
        ``share`` times the median step and wait until it closes or no load is left. The
        window's planned length in seconds; 0 where none was lent."""
        with self._cond:
            if self._parked == 0 or not self._steps:
                return 0.0
            length = self.share * statistics.median(self._steps)
            self._open_until = self._clock() + length
            self.lent += 1
            self.lent_seconds += length
            self._cond.notify_all()
            while self._loads > 0:
                left = self._open_until - self._clock()
                if left <= 0:
                    break
                self._cond.wait(left)
            self._open_until = float("-inf")
            return length


@dataclass(frozen=True)
class LoadPacing:
    ratio: float = PAUSE_RATIO
    busy: Callable[[], bool] = _always  # whether steps are running that a load would slow
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.thread_time  # the loading thread's own CPU time
    windows: LoadWindows | None = None  # the engine's turns between steps, if it lends them

    def now(self) -> float:
        """Where a chunk of work starts, for `pause_after` (the thread's CPU time)."""
        return self.clock()

    def active(self) -> bool:
        """Whether a load pauses now: steps run beside it and the pacing is on."""
        return self.ratio > 0 and self.busy()

    @contextmanager
    def loading(self) -> Iterator[None]:
        """Around one whole load: a window lent for it ends when it does."""
        if self.windows is None:
            yield
        else:
            with self.windows.loading():
                yield

    def pause_after(self, started: float) -> None:
        """If anything runs beside this thread: its turn from the windows (`LoadWindows`),
        or, where there are none or none came in time, a sleep of `ratio` times the CPU time
        this thread spent since `started` (`now()`)."""
        if not self.active():
            return
        if self.windows is not None and self.windows.take_turn(self.busy):
            return
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
