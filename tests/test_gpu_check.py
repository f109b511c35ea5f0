"""The GPU machine's one call for issue 18 (benchmarks/gpu_check.py), checked here where no
GPU is: the import shim reaches every package, the plan runs every gpu-marked test file and
fits the call's limits, and the random Llama standing in for the default model has its
shapes."""

from __future__ import annotations

import os
import sys
import time
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from gpu_check import run_logged  # noqa: E402
from gpu_plan import MIN_STEP_S, RESERVE_S, gpu_test_files, plan, step_timeout  # noqa: E402
from import_shim import build_shim, package_links  # noqa: E402

# What comes back from a device call's $OUT (device README: at most 8 files).
MAX_FILES_BACK = 8


def test_the_shim_reaches_every_package_setuptools_installs(tmp_path):
    shim = build_shim(tmp_path / "shim")
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    for package in packages["packages"]:
        folder = shim.joinpath(*package.split("."))
        assert (folder / "__init__.py").is_file(), package
    assert not (shim / "loragate" / "__init__.py").exists()  # a namespace, as installed
    build_shim(tmp_path / "shim")  # a second build replaces the first


def test_a_nested_package_outside_its_parents_folder_is_refused(tmp_path):
    (tmp_path / "pyproject.toml").write_text(
        '[tool.setuptools.package-dir]\n"loragate.engine" = "engine"\n'
        '"loragate.engine.models" = "elsewhere/models"\n'
    )
    with pytest.raises(ValueError, match="not inside its parent"):
        package_links(tmp_path)


def test_the_plan_runs_every_gpu_test_file_first_and_fits_the_call(tmp_path):
    out = tmp_path / "out"
    steps = plan(tmp_path / "work", out, tmp_path / "tokenizer")
    assert steps[0].name == "pytest"
    assert {"tests/kernels/test_gpu.py", "tests/engine/test_cuda_engine.py"} <= set(
        gpu_test_files()
    )
    for test_file in gpu_test_files():
        assert test_file in steps[0].argv
    names = [step.name for step in steps]
    for index, step in enumerate(steps):
        assert set(step.needs) <= set(names[:index]), f"{step.name} needs a later step"
    pictures = {a for step in steps for a in step.argv if a.startswith(str(out))}
    files_back = {"summary.md"} | {step.log for step in steps} | pictures
    assert len(files_back) <= MAX_FILES_BACK
    sizes = [a for step in steps if step.name.startswith("multi_lora") for a in step.argv]
    assert "1,16,64" in sizes  # LoRA's cost at 1, 16 and 64 adapters (issue 18, item 4)


def test_each_step_gets_its_cap_or_what_the_budget_has_left():
    assert step_timeout(60, 1000) == 60
    assert step_timeout(60, 40) == 40 - RESERVE_S
    assert step_timeout(60, MIN_STEP_S + RESERVE_S - 1) is None


def test_the_stand_in_for_the_default_model_has_its_shapes():
    from random_llama import SIZES

    from loragate.engine.model_loader import load_config, resolve_model

    config = load_config(resolve_model(None).hf_dir)
    for key, value in SIZES["135m"].items():
        assert getattr(config, key) == value, key
    assert config.vocab_size == 49152


def test_a_step_past_its_timeout_is_killed_with_its_children(tmp_path):
    """The step's whole process group goes: a benchmark's worker must not outlive it."""
    pid_file = tmp_path / "child.pid"
    script = (
        "import subprocess, sys, time; "
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
        f"open({str(pid_file)!r}, 'w').write(str(child.pid)); time.sleep(60)"
    )
    log = tmp_path / "step.log"
    status, seconds = run_logged([sys.executable, "-c", script], log, 3, dict(os.environ))
    assert status is None and seconds < 30
    assert "killed after 3 s" in log.read_text()
    child = int(pid_file.read_text())
    for _ in range(50):
        if not _running(child):
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"the step's child {child} outlived the step")
    status, _ = run_logged([sys.executable, "-c", "print('ok')"], log, 30, dict(os.environ))
    assert status == 0 and log.read_text().endswith("ok\n")


def _running(pid: int) -> bool:
    """Alive and not a zombie (a killed orphan waits for whoever reaps it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"
