"""An adapter's life has one owner (issues 44 and 58): the engine's AdapterResidency builds
and alone holds the adapter tiers (adapters/cpu_tier.py, adapters/device_tier.py) and is
the only writer of their holds; the scheduler, the runner, the CUDA graphs, the stats, the
async engine and the gateway ask the residency.

Checked twice: no module but engine/lora/adapter_residency.py names a tier (imports
`CpuTier` or `DeviceTier`, or reads a residency's `._cpu` / `._device`), and no module but it
holds or releases weights on a tier or writes a tier's holds (only the CPU tier itself
keeps them); and in a running engine with LoRA neither tier can be reached from the
AsyncLLMEngine without passing through the residency.
"""

from __future__ import annotations

import ast
import inspect
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from loragate.adapters.cpu_tier import CpuTier
from loragate.adapters.device_tier import DeviceTier
from loragate.engine import AsyncLLMEngine, EngineConfig, LLMEngine, PromptThread
from loragate.engine.api.input_processor import InputProcessor
from loragate.engine.lora.adapter_residency import AdapterResidency

ROOT = Path(__file__).resolve().parents[2]
OWNER = "engine/lora/adapter_residency.py"
FOLDERS = ("engine", "gateway", "plugins", "adapters")
TIERS = {"CpuTier", "DeviceTier"}
# The tiers' own modules, and the reports that read both (types only, under the owner's lock).
TIER_MODULES = {"adapters/cpu_tier.py", "adapters/device_tier.py", "adapters/tier_reports.py"}


def tier_users(paths) -> list[str]:
    """'file:line: what' for each import of a tier, each `<...>residency._cpu` or `._device`,
    each `.hold(...)` / `.release(...)` called on a tier (`<...>._cpu.hold(...)`,
    `cpu.release(...)`), and each write to `_holds`."""
    bad = []
    for path, text in paths:
        for node in ast.walk(ast.parse(text)):
            names = []
            if isinstance(node, ast.ImportFrom):
                names = [a.name for a in node.names if a.name in TIERS]
            elif isinstance(node, ast.Attribute) and node.attr in ("_cpu", "_device"):
                owner = node.value
                name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")
                if name.endswith("residency"):
                    names = [f"{name}.{node.attr}"]
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                tier = node.func.value
                tier = tier.attr if isinstance(tier, ast.Attribute) else getattr(tier, "id", "")
                if node.func.attr in ("hold", "release") and tier.lstrip("_") in ("cpu", "tier"):
                    names = [f"{tier}.{node.func.attr}"]
            elif isinstance(node, (ast.Assign, ast.AugAssign, ast.Delete)):
                targets = node.targets if not isinstance(node, ast.AugAssign) else [node.target]
                for target in targets:
                    for sub in ast.walk(target):
                        if isinstance(sub, ast.Attribute) and sub.attr == "_holds":
                            names.append("_holds")
            bad += [f"{path}:{node.lineno}: {name}" for name in names]
    return bad


def modules(skip=()) -> list[tuple[str, str]]:
    found = []
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = str(path.relative_to(ROOT))
            if rel != OWNER and rel not in skip:
                found.append((rel, path.read_text()))
    return found


def test_no_module_but_the_residency_names_the_tiers_or_writes_their_holds():
    assert tier_users(modules(skip=TIER_MODULES)) == []
    # Among the tiers' own modules: the reports name the tiers (types), and the CPU tier
    # writes the holds it keeps; nothing else.
    own = tier_users([(p, t) for p, t in modules() if p in TIER_MODULES])
    allowed = [
        u
        for u in own
        if (u.startswith("adapters/tier_reports.py") and u.endswith("Tier"))
        or (u.startswith("adapters/cpu_tier.py") and u.endswith(": _holds"))
    ]
    assert own == allowed and allowed


def test_the_check_catches_a_module_that_reaches_a_tier():
    calls = "def stats(engine):\n    return engine.residency._cpu.counts()\n"
    imports = "from loragate.adapters.device_tier import DeviceTier\n"
    holds = "def keep(self, identity):\n    self._cpu.hold(identity)\n"
    writes = "def keep(tier, identity):\n    tier._holds[identity] += 1\n"
    assert tier_users(
        [
            ("engine/x.py", calls),
            ("engine/y.py", imports),
            ("engine/z.py", holds),
            ("engine/w.py", writes),
        ]
    ) == [
        "engine/x.py:2: residency._cpu",
        "engine/y.py:1: DeviceTier",
        "engine/z.py:2: _cpu.hold",
        "engine/w.py:2: _holds",
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


def test_only_the_residency_holds_the_tiers(engine):
    residency = engine.engine.residency
    assert isinstance(residency, AdapterResidency)
    tiers = [t for t in vars(residency).values() if isinstance(t, (CpuTier, DeviceTier))]
    assert sorted(type(t).__name__ for t in tiers) == ["CpuTier", "DeviceTier"]
    for tier in tiers:
        assert holders_of(tier, engine, skip=residency) == []
    # The walk does find a tier when something else holds it.
    engine.engine.runner.leak = tiers[0]
    try:
        assert holders_of(tiers[0], engine, skip=residency) == ["engine.engine.runner.leak"]
    finally:
        del engine.engine.runner.leak


def test_the_engine_reads_adapters_on_one_loader_pool(engine):
    """The residency's loader threads are the only pool that reads and validates adapters
    into memory: the async engine keeps none of its own (it had one before issue 44). A
    download from the adapter store runs on a thread of its own, never holding up a load.
    The one other pool tokenizes a server's prompts (engine/api/prompt_thread.py) and holds
    nothing but its own copy of the engine's InputProcessor."""
    pools = reachable(lambda obj: isinstance(obj, ThreadPoolExecutor), engine)
    prompts = engine._prompts
    loaders = [pool for _, pool in pools if pool is not prompts._pool]
    assert loaders == [engine.engine.residency._pool], pools
    assert [path for path, pool in pools if pool is prompts._pool] == ["engine._prompts._pool"]
    assert isinstance(prompts, PromptThread) and set(vars(prompts)) == {"inputs", "_pool"}
    assert isinstance(prompts.inputs, InputProcessor) and prompts.inputs is not engine.engine.inputs
