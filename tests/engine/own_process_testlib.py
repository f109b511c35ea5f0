"""Runs a test's body in a fresh interpreter, for behaviour that belongs to the whole process
("when the last engine of the process shuts down"): in the suite's own process an engine
that another module's session-scoped server still runs would hold that state, depending on
which modules ran before (in turn, or on the same pytest-xdist worker).

The body sees `tiny_engine()`: an AsyncLLMEngine over the tiny Llama at `model_dir`. It
asserts what it checks; the test fails with its traceback."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

PRELUDE = """
import gc, sys, weakref
from loragate.engine import EngineConfig, LLMEngine
from loragate.engine.api.async_engine import AsyncLLMEngine
MODEL_DIR = sys.argv[1]
def tiny_engine():
    config = EngineConfig(model=MODEL_DIR, max_model_len=128, num_kv_blocks=16)
    return AsyncLLMEngine(LLMEngine(config))
"""


def run_in_own_process(body: str, model_dir: Path, timeout: float = 300) -> None:
    script = PRELUDE + textwrap.dedent(body) + "\nprint('checked')\n"
    done = subprocess.run(
        [sys.executable, "-c", script, str(model_dir)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0 and done.stdout.strip().endswith("checked"), done.stderr[-4000:]
