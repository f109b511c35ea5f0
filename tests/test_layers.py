"""Imports go one way (gateway -> engine -> adapters -> plugins -> kernels).

Always as loragate.<layer>.
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ["kernels", "plugins", "adapters", "engine", "gateway"]
CODE_DIRS = LAYERS + ["tests", "benchmarks", "examples"]


def _imported_modules(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
            if node.module == "loragate":
                found += [(node.lineno, f"loragate.{alias.name}") for alias in node.names]
    return found


def _python_files(folder: str) -> list[Path]:
    return [p for p in (ROOT / folder).rglob("*.py") if ".venv" not in p.parts]


@pytest.mark.parametrize("folder", CODE_DIRS)
def test_no_bare_layer_imports(folder):
    bad = [
        f"{path.relative_to(ROOT)}:{line}: import {name}"
        for path in _python_files(folder)
        for line, name in _imported_modules(path)
        if name.split(".")[0] in LAYERS
    ]
    assert not bad, "import layers as loragate.<layer>, never bare:\n" + "\n".join(bad)


@pytest.mark.parametrize("layer", LAYERS)
def test_imports_only_go_down(layer):
    above = LAYERS[LAYERS.index(layer) + 1 :]
    bad = [
        f"{path.relative_to(ROOT)}:{line}: import {name}"
        for path in _python_files(layer)
        for line, name in _imported_modules(path)
        if name.startswith("loragate.") and name.split(".")[1] in above
    ]
    assert not bad, f"{layer}/ may not import layers above it:\n" + "\n".join(bad)
