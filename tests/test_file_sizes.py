"""Small files that each own one idea: no source file of the project grows past 400 lines.

A file that reaches the limit is split along its ideas, never squeezed under it.
"""

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CODE_DIRS = [
    "kernels", "plugins", "adapters", "engine", "registry", "tools", "gateway",
    "tests", "benchmarks", "examples",
]  # fmt: skip
SUFFIXES = {".py", ".c", ".h", ".cu", ".js", ".html", ".css"}
MAX_LINES = 400


def _sources() -> list[Path]:
    found = []
    for name in CODE_DIRS:
        found += [p for p in (ROOT / name).rglob("*") if p.suffix in SUFFIXES and p.is_file()]
    return sorted(found)


def test_the_walk_sees_the_project():
    names = {p.relative_to(ROOT).as_posix() for p in _sources()}
    assert {"engine/llm_engine.py", "kernels/attention_cpu.c", "tests/test_layers.py"} <= names


@pytest.mark.parametrize("path", _sources(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_source_file_is_over_the_limit(path):
    lines = len(path.read_text(errors="replace").splitlines())
    assert lines <= MAX_LINES, f"{path.relative_to(ROOT)} has {lines} lines (max {MAX_LINES})"
