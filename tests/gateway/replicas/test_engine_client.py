"""EngineClient (loragate.engine) is the one engine surface the gateway uses: the in-process
AsyncLLMEngine and the Ray Serve ReplicatedEngine implement every member of it with the
same signature, so no route can work on one and fail on the other (issue 35: chat through
`--replicas` failed on a drifted `apply_chat_template`). They are the only engines the
gateway holds, in every mode (one process, with an adapter store, `--replicas`), and none
forwards by `__getattr__` (issue 44: a proxy's members escape this check)."""

from __future__ import annotations

import ast
import inspect
import pathlib
import re

import pytest
from gateway_testlib import ENGINE

from loragate.adapters.store import AdapterFetcher
from loragate.engine import AsyncLLMEngine, EngineClient, EngineConfig
from loragate.gateway.assembly.services import build_services
from loragate.gateway.replicas.replicated_engine import ReplicatedEngine
from loragate.gateway.settings import GatewaySettings

IMPLEMENTATIONS = [AsyncLLMEngine, ReplicatedEngine]
ROOT = pathlib.Path(__file__).resolve().parents[3]
GATEWAY = ROOT / "gateway"


def protocol_members() -> dict[str, object]:
    members = {}
    for name, value in vars(EngineClient).items():
        if name.startswith("_"):
            continue
        if isinstance(value, property) or inspect.isfunction(value):
            members[name] = value
    return members


def test_the_protocol_names_what_the_gateway_calls():
    assert {"generate_request", "abort", "apply_chat_template", "encode", "stats"} <= set(
        protocol_members()
    )


@pytest.mark.parametrize("impl", IMPLEMENTATIONS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("name", sorted(protocol_members()))
def test_every_member_has_the_protocols_signature(impl, name):
    member = protocol_members()[name]
    if isinstance(member, property):
        # A property of the protocol may be a property or a plain attribute set in __init__.
        own = inspect.getattr_static(impl, name, None)
        if own is None:
            source = inspect.getsource(impl.__init__)
            assert re.search(rf"self\.{name}\b\s*[:=]", source), f"{impl.__name__} lacks {name}"
        else:
            assert isinstance(own, property), f"{impl.__name__}.{name} is not a property"
        return
    own = inspect.getattr_static(impl, name, None)
    assert own is not None, f"{impl.__name__} lacks {name}()"
    assert inspect.signature(own) == inspect.signature(member), (
        f"{impl.__name__}.{name}{inspect.signature(own)} != "
        f"EngineClient.{name}{inspect.signature(member)}"
    )
    # Coroutine, async generator or plain function: the way to call it is part of it.
    kinds = (inspect.iscoroutinefunction, inspect.isasyncgenfunction)
    if inspect.iscoroutinefunction(member):
        assert inspect.iscoroutinefunction(own), f"{impl.__name__}.{name} must be async"
    elif name in ("generate", "generate_request"):
        assert inspect.isasyncgenfunction(own), f"{impl.__name__}.{name} must stream"
    else:
        assert not any(kind(own) for kind in kinds), f"{impl.__name__}.{name} must be sync"


def test_the_gateway_is_typed_against_the_protocol_only():
    """No gateway module outside the replicas' own deployment names AsyncLLMEngine: the
    app builds one (its lifespan) and everything else takes an EngineClient."""
    users = []
    for path in GATEWAY.rglob("*.py"):
        text = path.read_text()
        if re.search(r"^from loragate\.engine import .*\bAsyncLLMEngine\b", text, re.M):
            users.append(str(path.relative_to(GATEWAY)))
        for line in text.splitlines():
            if re.search(r"engine: AsyncLLMEngine", line):
                users.append(f"{path.relative_to(GATEWAY)}: {line.strip()}")
    assert sorted(set(users)) == ["assembly/app.py", "replicas/engine_replica.py"], users


# The classes that read through to another object by `__getattr__`, none of them an engine:
# a record reads its metadata's fields, the registry seam records each store call's health.
FORWARDING = {
    "gateway/adapter_control/served_adapters.py:AdapterRecord",
    "gateway/registry_seam.py:RegistrySeam",
}


def test_no_engine_forwards_by_getattr():
    """A `__getattr__` proxy passes for any protocol while its members go unchecked, so no
    engine-side or gateway class forwards that way but the known non-engines."""
    found = set()
    for folder in ("gateway", "engine"):
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ClassDef) and any(
                    isinstance(item, ast.FunctionDef) and item.name == "__getattr__"
                    for item in node.body
                ):
                    found.add(f"{path.relative_to(ROOT)}:{node.name}")
    assert found <= FORWARDING, sorted(found - FORWARDING)
    for impl in IMPLEMENTATIONS:
        assert inspect.getattr_static(impl, "__getattr__", None) is None, impl


def engines_held(services) -> list:
    """Every object among the services (and what they hold, through gateway objects,
    containers and bound methods) that passes for an EngineClient."""
    return held(services, EngineClient)


def held(services, kind) -> list:
    """Every object of ``kind`` among the services and what they hold, through gateway
    objects, containers and bound methods (never into an engine: its insides are not the
    gateway's)."""
    seen, found, todo = set(), [], list(vars(services).values())
    while todo:
        obj = todo.pop()
        if id(obj) in seen or obj is None or isinstance(obj, (str, bytes, int, float, type)):
            continue
        seen.add(id(obj))
        if isinstance(obj, kind):
            found.append(obj)
        if isinstance(obj, (kind, EngineClient)):
            continue  # the engine's own insides are not the gateway's
        if inspect.ismethod(obj):
            todo.append(obj.__self__)
        elif isinstance(obj, dict):
            todo += list(obj.values())
        elif isinstance(obj, (list, tuple, set, frozenset)):
            todo += list(obj)
        elif type(obj).__module__.startswith("loragate.gateway"):
            todo += list(getattr(obj, "__dict__", {}).values())
            for closure in getattr(obj, "__closure__", None) or ():
                todo.append(closure.cell_contents)
        elif inspect.isfunction(obj) and obj.__closure__:
            todo += [cell.cell_contents for cell in obj.__closure__]
    return found


@pytest.fixture(scope="module")
def tiny_engine(tiny_dir):
    config = EngineConfig(model=str(tiny_dir), **ENGINE)
    engine = AsyncLLMEngine.from_config(config)
    yield config, engine
    engine.shutdown()


@pytest.mark.parametrize("mode", ["one process", "adapter store", "replicas"])
def test_the_gateway_holds_one_checked_engine_in_every_mode(mode, tiny_engine, tmp_path):
    """What the app assembles holds exactly the engine it was given, of a class checked
    above: no wrapper in front of it (StoreBackedEngine was one, before issue 44), and no
    adapter store fetcher beside it (issue 58: the gateway tells the engine of the store's
    objects through its EngineClient)."""
    config, local = tiny_engine
    options = {"adapter_cache_dir": tmp_path / "cache"}
    if mode == "adapter store":
        options["adapter_store"] = str(tmp_path / "store")
    if mode == "replicas":
        options["replicas"] = 2
    settings = GatewaySettings(engine=config, port=0, **options)
    reports = None
    engine = local
    if mode == "replicas":
        engine = ReplicatedEngine(None, None, local.model_info, local.prompt_processor)

        async def reports():
            return []

    services, _ = build_services(settings, engine, None, reports)
    engines = engines_held(services)
    assert engines and all(found is engine for found in engines), engines
    assert held(services, AdapterFetcher) == []
    assert type(engine) in IMPLEMENTATIONS
    assert not any(hasattr(type(found), "__getattr__") for found in engines)
