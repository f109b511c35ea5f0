"""The engine and the server set how long OpenMP workers spin before sleeping (before torch
loads libgomp, which reads it once), unless the environment already says."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


def spin_after_import(module: str, env_value: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "GOMP_SPINCOUNT"}
    if env_value is not None:
        env["GOMP_SPINCOUNT"] = env_value
    code = f"import os, {module}, torch; print(os.environ['GOMP_SPINCOUNT'])"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.mark.parametrize("module", ["loragate.engine", "loragate.gateway"])
def test_importing_sets_the_spin_count_before_torch_loads(module):
    assert spin_after_import(module, None) == "50000"


def test_a_spin_count_in_the_environment_wins():
    assert spin_after_import("loragate.engine", "300000") == "300000"
