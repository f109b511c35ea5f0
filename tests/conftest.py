"""Shared fixtures. Triton kernels run under the interpreter when no GPU is present."""

import os
import sys

import pytest
import torch

# The suite compares with float32 references (HF, PEFT), so dtype="auto" must resolve to
# float32 here, in this process and in every server it starts; a machine with native bf16
# would otherwise pick bf16. Tests of the choice itself set the variable themselves.
os.environ["LORAGATE_CPU_BF16"] = "0"

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


# The suite's result is pytest's exit status, decided once the summary is printed. One full
# run on a 2-core AMD EPYC (2026-11-25) then crashed the interpreter while it tore down
# (SIGSEGV after "1527 passed": daemon threads of engines and servers that tests left
# running, still inside torch or OpenMP when the interpreter finalised), so `make test`
# failed with every test passed. Leaving at once after the summary reports what the tests
# found; the crash at teardown is a known issue to find and fix (see the session notes).
_EXIT_STATUS: list[int] = []


def pytest_sessionfinish(session, exitstatus):
    _EXIT_STATUS.append(int(exitstatus))


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    if _EXIT_STATUS:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(_EXIT_STATUS[-1])
