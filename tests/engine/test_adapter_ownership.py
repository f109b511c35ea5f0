"""An adapter's life has one owner (issue 44): the engine's AdapterResidency is the only
object that holds or calls the adapter cache (tiers, slots, loads); the scheduler, the
runner, the CUDA graphs, the stats, the async engine and the gateway ask the residency.

Checked twice: no module but engine/lora/adapter_residency.py names the cache (imports
`AdapterCache`, or reads a residency's `.cache`), and in a running engine with LoRA the cache
cannot be reached from the AsyncLLMEngine without passing through the residency.
"""

from __future__ import annotations

import ast
import inspect
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from loragate.adapters import AdapterCache
from loragate.engine import AsyncLLMEngine, EngineConfig, LLMEngine
from loragate.engine.lora.adapter_residency import AdapterResidency

ROOT = Path(__file__).resolve().parents[2]
OWNER = "engine/lora/adapter_residency.py"
FOLDERS = ("engine", "gateway", "plugins")


def cache_users(paths) -> list[str]:
    """'file:line: what' for each import of the cache and each `<...>residency.cache`."""
    bad = []
    for path, text in paths:
        for node in ast.walk(ast.parse(text)):
            names = []
            if isinstance(node, ast.ImportFrom):
                names = [a.name for a in node.names if a.name == "AdapterCache"]
            elif isinstance(node, ast.Attribute) and node.attr == "cache":
                owner = node.value
                name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")
                if name.endswith("residency"):
                    names = [f"{name}.cache"]
            bad += [f"{path}:{node.lineno}: {name}" for name in names]
    return bad


def modules() -> list[tuple[str, str]]:
    found = []
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = str(path.relative_to(ROOT))
            if rel != OWNER:
                found.append((rel, path.read_text()))
    return found


def test_no_module_but_the_residency_names_the_adapter_cache():
    assert cache_users(modules()) == []


def test_the_check_catches_a_module_that_calls_the_cache():
    calls = "def stats(engine):\n    return engine.residency.cache.stats()\n"
    imports = "from loragate.adapters import AdapterCache\n"
    assert cache_users([("engine/x.py", calls), ("engine/y.py", imports)]) == [
        "engine/x.py:2: residency.cache",
        "engine/y.py:1: AdapterCache",
    ]


def holders_of(target, start, skip) -> list[str]:
    """Paths from ``start`` to ``target`` through loragate objects, containers, bound methods
    and closures, never through ``skip``."""
    return [path for path, _ in reachable(lambda obj: obj is target, start, skip)]


def reachable(found, start, skip=None) -> list[tuple[str, object]]:
    """(a path from ``start``, the object) for each object ``found`` accepts, through
    loragate objects, containers, bound methods and closures, never through ``skip``."""
    seen, paths, todo = {id(skip)}, [], [(start, "engine")]
    while todo:
        obj, path = todo.pop()
        if found(obj):
            if id(obj) not in seen:
                paths.append((path, obj))
                seen.add(id(obj))
            continue
        if id(obj) in seen or isinstance(obj, (str, bytes, int, float, bool, type, torch.Tensor)):
            continue
        seen.add(id(obj))
        if inspect.ismethod(obj):
            todo.append((obj.__self__, f"{path}.__self__"))
        elif inspect.isfunction(obj):
            cells = obj.__closure__ or ()
            todo += [(c.cell_contents, f"{path}<closure>") for c in cells]
        elif isinstance(obj, dict):
            todo += [(v, f"{path}[{k!r}]") for k, v in list(obj.items())[:10_000]]
        elif isinstance(obj, (list, tuple, set, frozenset)):
            todo += [(v, f"{path}[]") for v in list(obj)[:10_000]]
        elif type(obj).__module__.startswith("loragate."):
            fields = dict(getattr(obj, "__dict__", {}))
            for name in getattr(type(obj), "__slots__", ()):
                if hasattr(obj, name):
                    fields[name] = getattr(obj, name)
            todo += [(v, f"{path}.{k}") for k, v in fields.items()]
    return paths


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    config = EngineConfig(
        model=str(tiny_model_dir("llama")),
        max_model_len=128,
        num_kv_blocks=64,
        enable_lora=True,
        max_loras=2,
        max_cpu_loras=2,
        max_lora_rank=8,
    )
    engine = AsyncLLMEngine(LLMEngine(config))
    yield engine
    engine.shutdown()


def test_only_the_residency_holds_the_cache(engine):
    residency = engine.engine.residency
    assert isinstance(residency, AdapterResidency)
    assert isinstance(residency.cache, AdapterCache)
    assert holders_of(residency.cache, engine, skip=residency) == []
    # The walk does find the cache when something else holds it.
    engine.engine.runner.leak = residency.cache
    try:
        assert holders_of(residency.cache, engine, skip=residency) == ["engine.engine.runner.leak"]
    finally:
        del engine.engine.runner.leak


def test_the_engine_reads_adapters_on_one_loader_pool(engine):
    """The residency's loader threads are the only pool that reads and validates adapters
    into memory: the async engine keeps none of its own (it had one before issue 44). A
    download from the adapter store runs on a thread of its own, never holding up a load."""
    pools = reachable(lambda obj: isinstance(obj, ThreadPoolExecutor), engine)
    assert [pool for _, pool in pools] == [engine.engine.residency._pool], pools
