"""A running AsyncLLMEngine shortens the interpreter's switch interval, so its engine thread
gets the GIL back soon after each torch call (engine/core/gil_handoff.py), and sets it back when
the last engine of the process shuts down. Each check runs in a process of its own: the
interval is the whole process's."""

from __future__ import annotations

from own_process_testlib import run_in_own_process

from loragate.engine.core.gil_handoff import SWITCH_INTERVAL_S


def test_the_interval_is_short_while_an_engine_runs_and_restored_after(tiny_model_dir):
    run_in_own_process(
        f"""
        SHORT = {SWITCH_INTERVAL_S!r}
        before = sys.getswitchinterval()
        assert before > SHORT  # the interpreter's default, 5 ms
        first = tiny_engine()
        second = tiny_engine()
        try:
            assert sys.getswitchinterval() == SHORT
            first.shutdown()
            assert sys.getswitchinterval() == SHORT  # one engine still runs
        finally:
            first.shutdown()  # twice: counted once
            second.shutdown()
        assert sys.getswitchinterval() == before
        """,
        tiny_model_dir("llama"),
    )


def test_a_shorter_interval_set_by_the_process_is_kept(tiny_model_dir):
    run_in_own_process(
        f"""
        sys.setswitchinterval({SWITCH_INTERVAL_S / 5!r})
        short = sys.getswitchinterval()  # as the interpreter keeps it (whole microseconds)
        engine = tiny_engine()
        try:
            assert sys.getswitchinterval() == short
        finally:
            engine.shutdown()
        assert sys.getswitchinterval() == short
        """,
        tiny_model_dir("llama"),
    )
