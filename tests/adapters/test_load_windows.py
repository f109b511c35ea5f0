"""Adapter loads beside the steps take turns with them (adapters/pacing.py's LoadWindows): a
load parks at its pauses until the engine lends it a window between two steps, runs through
the window, and the engine goes on once the window closes or the load ends.

The windows' times come from an injected clock that stands still unless a test moves it, so
what ends a window (the load ending, the clock passing its end) is the test's choice, never
the machine's speed. A wait that the code gets wrong hangs; each thread is joined with a
timeout and the test fails on it."""

from __future__ import annotations

import threading
import time

import pytest

from loragate.adapters import LoadPacing, LoadWindows
from loragate.adapters.pacing import WINDOW_SHARE

JOIN_S = 10.0


class StillClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def wait_until(condition, what: str) -> None:
    deadline = time.monotonic() + JOIN_S
    while not condition():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.001)


def finish(thread: threading.Thread) -> None:
    thread.join(JOIN_S)
    assert not thread.is_alive(), "a thread waited past its window"


def test_a_parked_load_runs_when_the_next_window_opens_and_the_window_ends_with_the_load():
    windows = LoadWindows(max_park=60.0, clock=StillClock())  # the window never times out
    turns: list[bool] = []
    may_end = threading.Event()

    def load():
        with windows.loading():
            turns.append(windows.take_turn(lambda: True))
            turns.append(windows.take_turn(lambda: True))  # inside the window: no parking
            may_end.wait(JOIN_S)

    windows.observe(0.040)
    loader = threading.Thread(target=load, daemon=True)
    loader.start()
    wait_until(lambda: windows._parked == 1, "the load parked")
    assert turns == [], "a load went on with no window lent"

    lent: list[float] = []
    engine = threading.Thread(target=lambda: lent.append(windows.lend()), daemon=True)
    engine.start()
    wait_until(lambda: len(turns) == 2, "the load ran in the window")
    assert turns == [True, True]
    assert engine.is_alive(), "the window closed while its load still ran"
    may_end.set()
    finish(loader)
    finish(engine)  # the clock stands still: only the load's end closes the window
    assert lent == [pytest.approx(WINDOW_SHARE * 0.040)]
    assert windows.lent == 1 and windows.lent_seconds == pytest.approx(WINDOW_SHARE * 0.040)


def test_a_window_closes_when_its_time_is_up_though_the_load_goes_on():
    clock = StillClock()
    windows = LoadWindows(max_park=60.0, clock=clock)
    windows.observe(0.030)
    parked_again = threading.Event()
    turns: list[bool] = []

    def load():
        with windows.loading():
            turns.append(windows.take_turn(lambda: True))
            wait_until(lambda: clock.now > 200, "the clock moved")
            parked_again.set()
            turns.append(windows.take_turn(lambda: True))  # the window is over: parks

    loader = threading.Thread(target=load, daemon=True)
    loader.start()
    wait_until(lambda: windows._parked == 1, "the load parked")
    engine = threading.Thread(target=windows.lend, daemon=True)
    engine.start()
    wait_until(lambda: turns == [True], "the load ran in the window")
    clock.now = 300.0  # past the window's end
    finish(engine)
    parked_again.wait(JOIN_S)
    wait_until(lambda: windows._parked == 1, "the load parked again")
    assert turns == [True]
    windows.lend()  # the next window
    finish(loader)
    assert turns == [True, True] and windows.lent == 2


def test_no_window_is_lent_while_no_load_waits_for_one():
    windows = LoadWindows(clock=StillClock())
    windows.observe(0.050)
    assert windows.lend() == 0.0, "nothing is loading"
    with windows.loading():  # a load under way but running, not parked
        assert windows.lend() == 0.0
    assert windows.lent == 0


def test_the_window_is_a_share_of_the_median_step_not_of_the_last():
    """A prompt's long chunk would otherwise buy the next short step a window as long."""
    windows = LoadWindows(max_park=60.0, clock=StillClock())
    for seconds in (0.040, 0.042, 0.038, 0.900):
        windows.observe(seconds)
    ready = threading.Event()

    def load():
        with windows.loading():
            ready.set()
            windows.take_turn(lambda: True)

    loader = threading.Thread(target=load, daemon=True)
    loader.start()
    wait_until(lambda: windows._parked == 1, "the load parked")
    assert windows.lend() == pytest.approx(WINDOW_SHARE * 0.041)
    finish(loader)


def test_a_parked_load_goes_on_once_nothing_runs_beside_it():
    windows = LoadWindows(max_park=60.0, clock=StillClock())
    busy = [True]
    turns: list[bool] = []

    def load():
        with windows.loading():
            turns.append(windows.take_turn(lambda: busy[0]))

    loader = threading.Thread(target=load, daemon=True)
    loader.start()
    wait_until(lambda: windows._parked == 1, "the load parked")
    busy[0] = False  # the last sequence ended: no step to take turns with
    finish(loader)
    assert turns == [True] and windows.lent == 0


def test_a_pause_outside_a_load_takes_no_turn():
    """A window ends when the loads in it end: a thread that is in none would wait for
    windows closed before it runs, so it is told at once to pause its own way."""
    windows = LoadWindows(max_park=60.0, clock=StillClock())
    windows.observe(0.020)
    assert windows.take_turn(lambda: True) is False
    assert windows._parked == 0


def test_a_load_that_no_window_reaches_in_time_is_paced_by_its_cpu_time():
    """Steps longer than MAX_PARK_S (a long prompt's chunks): the load pauses by the ratio
    and goes on beside them rather than wait for the step to end."""
    windows = LoadWindows(max_park=0.01)
    pauses: list[float] = []
    pacing = LoadPacing(ratio=8.0, busy=lambda: True, sleep=pauses.append, windows=windows)
    with pacing.loading():
        began = pacing.now()
        while time.thread_time() - began < 0.005:
            pass
        pacing.pause_after(began)
    assert windows.lent == 0
    assert len(pauses) == 1 and pauses[0] >= 8 * 0.005


def test_a_load_whose_window_came_is_not_paused_by_its_cpu_time_too():
    windows = LoadWindows(max_park=60.0, clock=StillClock())
    windows.observe(0.020)
    pauses: list[float] = []
    pacing = LoadPacing(ratio=8.0, busy=lambda: True, sleep=pauses.append, windows=windows)

    def load():
        with pacing.loading():
            pacing.pause_after(pacing.now())

    loader = threading.Thread(target=load, daemon=True)
    loader.start()
    wait_until(lambda: windows._parked == 1, "the load parked")
    windows.lend()
    finish(loader)
    assert pauses == []
