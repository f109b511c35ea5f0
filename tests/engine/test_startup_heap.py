"""A running AsyncLLMEngine keeps the process's startup heap out of the cyclic collector's
walks (engine/core/startup_heap.py), and gives it back when the last engine shuts down.
Each check runs in a process of its own: the heap is the whole process's."""

from __future__ import annotations

import subprocess
import sys

from own_process_testlib import run_in_own_process


def test_objects_alive_at_start_are_not_walked_while_an_engine_runs(tiny_model_dir):
    run_in_own_process(
        """
        class Marker:  # a tracked object of our own, to find among the collector's objects
            pass

        def collected_sees(obj) -> bool:
            return any(o is obj for o in gc.get_objects())

        before = Marker()
        assert collected_sees(before)
        first = tiny_engine()
        made_while_running = Marker()
        second = tiny_engine()
        try:
            assert not collected_sees(before)
            # Frozen again when the second engine started: what was made since joins.
            assert not collected_sees(made_while_running)
            first.shutdown()
            # One engine still runs: the heap stays frozen.
            assert not collected_sees(before)
        finally:
            first.shutdown()  # twice: counted once
            second.shutdown()
        assert collected_sees(before) and collected_sees(made_while_running)
        assert gc.get_freeze_count() == 0
        """,
        tiny_model_dir("llama"),
    )


def test_an_engine_dropped_after_shutdown_is_collected(tiny_model_dir):
    run_in_own_process(
        """
        engine = tiny_engine()
        engine.shutdown()
        inner = weakref.ref(engine.engine)
        del engine
        gc.collect()
        assert inner() is None, "the engine's objects stayed frozen after its shutdown"
        """,
        tiny_model_dir("llama"),
    )


HELD_FREED = """
import ctypes
from loragate.engine.core.startup_heap import release_freed_heap
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
def anon():
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon"):
            return int(line.split()[1]) * 1024
MB = 1 << 20
libc.free(libc.malloc(4 * MB))  # glibc's mmap threshold rises: 1 MB chunks come from the heap
chunks = [libc.malloc(MB) for _ in range(64)]
for c in chunks:
    ctypes.memset(c, 1, MB)
above = libc.malloc(MB)  # a live chunk above them: the heap's top cannot shrink past it
for c in chunks:
    libc.free(c)
before = anon()
release_freed_heap()
print((before - anon()) // MB)
"""


def test_memory_the_c_heap_freed_goes_back_to_the_system():
    """What loading weights frees stays in glibc's heap until trimmed (about 50 MB after the
    default model's file); `release_freed_heap`, called once the engine is built, returns
    it. Shown in a process of its own: 64 freed 1 MB chunks below a live one."""
    done = subprocess.run(
        [sys.executable, "-c", HELD_FREED], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) >= 60, done.stdout
