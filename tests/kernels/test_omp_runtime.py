"""The OpenMP pool hand-off (kernels/omp_runtime.py), each check in a fresh interpreter:
thread pools are per process and outlive the code that started them."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

PRELUDE = """
import os, threading, torch
from loragate.kernels import omp_runtime
torch.set_num_threads(2)

def threads():
    return len(os.listdir("/proc/self/task"))

def parallel_work():
    x = torch.randn(4_000_000)
    for _ in range(3):
        x = (x * 1.0001).add_(1.0)
    return float(x.sum())
"""


def run(body: str) -> list[str]:
    script = PRELUDE + textwrap.dedent(body)
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_release_ends_the_calling_threads_workers():
    before, during, after, released = run(
        """
        before = threads()
        parallel_work()
        during = threads()
        released = omp_runtime.release_thread_pool()
        # A worker leaves the pool's barrier and then exits: the runtime does not join
        # it, so its task may linger in /proc for a moment after the call returns.
        import time
        deadline = time.monotonic() + 10
        while threads() > before and time.monotonic() < deadline:
            time.sleep(0.01)
        print(before, during, threads(), released)
        """
    )
    assert released == "True"
    assert int(during) > int(before), "the parallel region started no OpenMP worker"
    assert int(after) == int(before), (before, during, after)


def test_a_thread_set_to_one_thread_starts_no_pool():
    base, with_one, with_default = run(
        """
        def on_thread(setup):
            seen = []
            def body():
                setup()
                parallel_work()
                seen.append(threads())
            t = threading.Thread(target=body)
            t.start(); t.join()
            return seen[0]

        base = threads() + 1  # the helper thread itself
        print(base, on_thread(omp_runtime.use_one_thread), on_thread(lambda: None))
        """
    )
    assert int(with_one) == int(base)
    assert int(with_default) > int(base), "a default thread should start its own pool"


def test_torchs_runtime_is_chosen_when_sentencepiece_brings_its_own():
    """sentencepiece's wheel carries another libgomp; pausing that one would free nothing."""
    (chosen,) = run(
        """
        import sentencepiece  # noqa: F401  (loads its own libgomp)
        parallel_work()
        lib = omp_runtime._runtime()
        print(lib._name)
        """
    )
    assert "/torch/" in chosen, chosen
