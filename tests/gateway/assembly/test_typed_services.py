"""Route handlers get the narrow typed services they use through Litestar's `Provide`
(issue 44): no string-keyed service dict, no `NamedDependency`, and no module reads a
service out of the app's state by name; the one thing the app keeps there is its typed
`Services` (read by the readers Litestar gives no dependencies: middleware, guards)."""

from __future__ import annotations

import ast
import typing
from dataclasses import fields
from pathlib import Path

from loragate.gateway.assembly.app import create_app
from loragate.gateway.assembly.services import Services, service_providers
from loragate.gateway.settings import GatewaySettings

GATEWAY = Path(__file__).resolve().parents[3] / "gateway"


def state_reads(sources: list[tuple[str, str]]) -> list[str]:
    """'file:line: what' for each service read by name: `NamedDependency`, `state[...]`,
    `state.get(...)`, `getattr(state, ...)`, or `state.<name>` for any name but `services`."""
    bad = []
    for path, text in sources:
        for node in ast.walk(ast.parse(text)):
            where = f"{path}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.Name) and node.id == "NamedDependency":
                bad.append(f"{where}: NamedDependency")
            elif isinstance(node, ast.Subscript) and _is_state(node.value):
                bad.append(f"{where}: state[...]")
            elif isinstance(node, ast.Attribute) and _is_state(node.value):
                if node.attr != "services":
                    bad.append(f"{where}: state.{node.attr}")
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "getattr"
                and node.args
                and _is_state(node.args[0])
                and not (
                    isinstance(node.args[1], ast.Constant) and node.args[1].value == "services"
                )
            ):
                bad.append(f"{where}: getattr(state, ...)")
    return bad


def _is_state(node) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "state") or (
        isinstance(node, ast.Name) and node.id == "state"
    )


def test_no_service_is_read_by_name():
    sources = [(str(p.relative_to(GATEWAY)), p.read_text()) for p in GATEWAY.rglob("*.py")]
    sources = [(path, text) for path, text in sources if path != "assembly/services.py"]
    assert state_reads(sources) == []


def test_the_check_catches_each_way_of_reading_by_name():
    snippets = [
        ("a.py", "x = request.app.state['engine']\n"),
        ("b.py", "x = connection.app.state.auth\n"),
        ("c.py", "def h(engine: NamedDependency[EngineClient]): ...\n"),
        ("d.py", "x = getattr(app.state, 'metrics_report', None)\n"),
        ("e.py", "x = request.app.state.services.auth\n"),
    ]
    assert state_reads(snippets) == [
        "a.py:1: state[...]",
        "b.py:1: state.auth",
        "c.py:1: NamedDependency",
        "d.py:1: getattr(state, ...)",
    ]


def test_every_handler_names_its_services_by_type(tmp_path):
    """Each handler parameter that takes a service is annotated with the service's type,
    and the app provides exactly the typed services plus the caller."""
    app = create_app(GatewaySettings(port=0, adapter_cache_dir=tmp_path))
    types = typing.get_type_hints(Services)
    assert set(app.dependencies) == set(types) | {"caller"}
    assert set(service_providers()) == {f.name for f in fields(Services)}
    checked = 0
    for route in app.routes:
        for handler in route.route_handlers:
            for name, param in handler.parsed_fn_signature.parameters.items():
                if name in types:
                    assert param.annotation is types[name], f"{handler}: {name}: {param}"
                    checked += 1
    assert checked >= 20  # the routes do take their services this way
