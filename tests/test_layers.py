"""Imports go one way, as DESIGN.md's Layers draws them, always as loragate.<layer>.

kernels <- plugins <- adapters <- engine <- gateway, with the registry beside the engine (it
may use adapters; the engine never sees it) and the demo-adapter tools beside the gateway.
The gateway takes from the engine only the names `loragate.engine.__all__` offers.
"""

import ast
from pathlib import Path

import pytest

import loragate.engine

ROOT = Path(__file__).resolve().parent.parent
# Each layer and the layers it may import.
MAY_IMPORT = {
    "kernels": set(),
    "plugins": {"kernels"},
    "adapters": {"plugins", "kernels"},
    "engine": {"adapters", "plugins", "kernels"},
    "registry": {"adapters"},
    "tools": {"engine", "adapters", "plugins", "kernels"},
    "gateway": {"registry", "tools", "engine", "adapters", "plugins", "kernels"},
}
LAYERS = list(MAY_IMPORT)
CODE_DIRS = LAYERS + ["tests", "benchmarks", "examples"]


def _imports(path: Path) -> list[tuple[int, str, list[str]]]:
    """(line, module, names taken from it) for every absolute import in `path`."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [alias.name for alias in node.names]
            found.append((node.lineno, node.module, names))
            if node.module == "loragate":
                found += [(node.lineno, f"loragate.{name}", []) for name in names]
    return found


def _python_files(folder: str) -> list[Path]:
    return [p for p in (ROOT / folder).rglob("*.py") if ".venv" not in p.parts]


def _layer_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "loragate" and len(parts) > 1 else None


@pytest.mark.parametrize("folder", CODE_DIRS)
def test_no_bare_layer_imports(folder):
    bad = [
        f"{path.relative_to(ROOT)}:{line}: import {name}"
        for path in _python_files(folder)
        for line, name, _ in _imports(path)
        if name.split(".")[0] in LAYERS
    ]
    assert not bad, "import layers as loragate.<layer>, never bare:\n" + "\n".join(bad)


@pytest.mark.parametrize("layer", LAYERS)
def test_layers_import_only_what_they_may(layer):
    allowed = MAY_IMPORT[layer] | {layer}
    bad = [
        f"{path.relative_to(ROOT)}:{line}: import {name}"
        for path in _python_files(layer)
        for line, name, _ in _imports(path)
        if _layer_of(name) in LAYERS and _layer_of(name) not in allowed
    ]
    assert not bad, f"{layer}/ may import only {sorted(allowed)}:\n" + "\n".join(bad)


@pytest.mark.parametrize("layer", ["engine", "adapters", "plugins", "kernels"])
def test_registry_and_gateway_stay_out_of_the_engine_side(layer):
    bad = [
        f"{path.relative_to(ROOT)}:{line}: import {name}"
        for path in _python_files(layer)
        for line, name, _ in _imports(path)
        if _layer_of(name) in ("registry", "gateway")
    ]
    assert not bad, f"{layer}/ may not import the registry or the gateway:\n" + "\n".join(bad)


def test_gateway_uses_only_the_engines_public_names():
    public = set(loragate.engine.__all__)
    bad = []
    for path in _python_files("gateway"):
        for line, module, names in _imports(path):
            where = f"{path.relative_to(ROOT)}:{line}"
            if module.startswith("loragate.engine."):
                bad.append(f"{where}: import from {module} (use loragate.engine)")
            elif module == "loragate.engine":
                bad += [
                    f"{where}: {name} is not in __all__" for name in names if name not in public
                ]
    assert not bad, "the gateway imports only loragate.engine.__all__:\n" + "\n".join(bad)


# The gateway's parts, lowest first: each may import only the parts before it (and itself).
# A part is a folder under gateway/ or a module at its top (settings_checks goes with
# settings). See README's Layout.
GATEWAY_ORDER = [
    ("errors",),
    ("registry_seam",),
    ("tenancy",),
    ("adapter_control",),
    ("serving",),
    ("openai",),
    ("tgi",),
    ("admin",),
    ("settings", "settings_checks"),
    ("registry_care",),
    ("replicas",),
    ("observation",),
    ("assembly",),
]
GATEWAY_LEVEL = {part: level for level, parts in enumerate(GATEWAY_ORDER) for part in parts}


def _gateway_part(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if parts[:2] == ["loragate", "gateway"] and len(parts) > 2 else None


def gateway_backward_imports(root: Path) -> list[str]:
    """Every import in `root` (a gateway folder) of a gateway part above the importing
    part's place in GATEWAY_ORDER, as 'file:line: part imports other'."""
    bad = []
    for path in sorted(
        p for p in root.rglob("*.py") if p.name != "__init__.py" or p.parent != root
    ):
        rel = path.relative_to(root)
        part = rel.parts[0] if len(rel.parts) > 1 else rel.stem
        for line, name, _ in _imports(path):
            other = _gateway_part(name)
            if other is None or other == part:
                continue
            if GATEWAY_LEVEL.get(other, len(GATEWAY_ORDER)) > GATEWAY_LEVEL.get(part, -1):
                bad.append(f"{rel}:{line}: {part} imports {other}")
    return bad


def test_every_gateway_part_has_a_place_in_the_order():
    parts = {p.stem for p in (ROOT / "gateway").glob("*.py") if p.name != "__init__.py"}
    parts |= {p.name for p in (ROOT / "gateway").iterdir() if (p / "__init__.py").exists()}
    assert parts == set(GATEWAY_LEVEL), "name each gateway part in GATEWAY_ORDER (and README)"


def test_gateway_parts_import_only_downward():
    bad = gateway_backward_imports(ROOT / "gateway")
    order = " < ".join("/".join(parts) for parts in GATEWAY_ORDER)
    assert not bad, f"gateway parts import only those below them ({order}):\n" + "\n".join(bad)


def test_a_backward_gateway_import_is_caught(tmp_path):
    """The check fails on an import that goes up, and passes one that goes down."""
    serving = tmp_path / "serving"
    serving.mkdir()
    (serving / "down.py").write_text("from loragate.gateway.tenancy.principal import OPERATOR\n")
    assert gateway_backward_imports(tmp_path) == []
    (serving / "up.py").write_text(
        "def late():\n    from loragate.gateway.assembly.app import create_app\n"
    )
    assert gateway_backward_imports(tmp_path) == ["serving/up.py:2: serving imports assembly"]
