"""A running AsyncLLMEngine shortens the interpreter's switch interval, so its engine thread
gets the GIL back soon after each torch call (engine/core/gil_handoff.py), and sets it back when
the last engine of the process shuts down."""

from __future__ import annotations

import sys

from test_startup_heap import tiny_engine

from loragate.engine.core.gil_handoff import SWITCH_INTERVAL_S


def test_the_interval_is_short_while_an_engine_runs_and_restored_after(tiny_model_dir):
    before = sys.getswitchinterval()
    assert before > SWITCH_INTERVAL_S  # the interpreter's default, 5 ms
    first = tiny_engine(tiny_model_dir)
    second = tiny_engine(tiny_model_dir)
    try:
        assert sys.getswitchinterval() == SWITCH_INTERVAL_S
        first.shutdown()
        assert sys.getswitchinterval() == SWITCH_INTERVAL_S  # one engine still runs
    finally:
        first.shutdown()  # twice: counted once
        second.shutdown()
    assert sys.getswitchinterval() == before


def test_a_shorter_interval_set_by_the_process_is_kept(tiny_model_dir):
    before = sys.getswitchinterval()
    sys.setswitchinterval(SWITCH_INTERVAL_S / 5)
    short = sys.getswitchinterval()  # as the interpreter keeps it (whole microseconds)
    try:
        engine = tiny_engine(tiny_model_dir)
        try:
            assert sys.getswitchinterval() == short
        finally:
            engine.shutdown()
        assert sys.getswitchinterval() == short
    finally:
        sys.setswitchinterval(before)
