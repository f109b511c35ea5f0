"""No gateway code touches the adapter store's fetcher (issue 58): the engine's adapter
residency holds it (engine/lora/stored_adapters.py), and the gateway asks the engine, through
its EngineClient, for what it needs of it (objects written and deleted, the fetch count).

Checked in the source: no module under gateway/ but the adapter store's assembly
(gateway/adapter_control/adapter_store_setup.py, which builds the fetcher an engine is
started with) names `AdapterFetcher` or reads a `.fetcher`, nor calls a method on a
variable that holds one. The services the app assembles hold none either
(tests/gateway/replicas/test_engine_client.py).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
OWNER = "gateway/adapter_control/adapter_store_setup.py"


def fetcher_users(paths) -> list[str]:
    """'file:line: what' for each `AdapterFetcher` named, each `<...>.fetcher` read, and each
    attribute of a variable named `...fetcher`."""
    bad = []
    for path, text in paths:
        for node in ast.walk(ast.parse(text)):
            name = None
            if isinstance(node, ast.ImportFrom):
                if any(alias.name == "AdapterFetcher" for alias in node.names):
                    name = "AdapterFetcher"
            elif isinstance(node, ast.Name) and node.id == "AdapterFetcher":
                name = "AdapterFetcher"
            elif isinstance(node, ast.Attribute):
                owner = node.value
                if node.attr in ("fetcher", "AdapterFetcher"):
                    name = f".{node.attr}"
                elif isinstance(owner, ast.Name) and owner.id.endswith("fetcher"):
                    name = f"{owner.id}.{node.attr}"
            if name is not None:
                bad.append(f"{path}:{node.lineno}: {name}")
    return bad


def gateway_modules() -> list[tuple[str, str]]:
    found = []
    for path in sorted((ROOT / "gateway").rglob("*.py")):
        rel = str(path.relative_to(ROOT))
        if rel != OWNER:
            found.append((rel, path.read_text()))
    return found


def test_no_gateway_module_but_the_store_assembly_touches_the_fetcher():
    assert gateway_modules(), "no gateway modules found"
    assert fetcher_users(gateway_modules()) == []


def test_the_check_catches_each_way_to_the_fetcher():
    imports = "from loragate.adapters.store import AdapterFetcher\n"
    builds = "import loragate.adapters.store as s\nf = s.AdapterFetcher(store, cache)\n"
    reads = "def fetches(objects):\n    return objects.fetcher\n"
    calls = "def prune(fetcher):\n    return fetcher.prune()\n"
    assert fetcher_users(
        [("g/a.py", imports), ("g/b.py", builds), ("g/c.py", reads), ("g/d.py", calls)]
    ) == [
        "g/a.py:1: AdapterFetcher",
        "g/b.py:2: .AdapterFetcher",
        "g/c.py:2: .fetcher",
        "g/d.py:2: fetcher.prune",
    ]
