"""One request object from the route to the engine and over the replica wire (issue 58).

`EngineRequest` (engine/api/engine_request.py) is checked once, where it is built, and every
hop hands it on whole: the gateway's account builds it, `EngineClient.generate_request` takes
it, the ingress sends it to a replica as it is, the replica gives it to its engine, and
`LLMEngine.add` queues it. The eight values are spelled out as parameters only in the public
call shapes that build one (vLLM's `generate` and `add_request`)."""

from __future__ import annotations

import ast
import dataclasses
import pickle
from pathlib import Path

import pytest

from loragate.adapters import LoRARequest
from loragate.engine import EngineRequest, InvalidParam, SamplingParams

ROOT = Path(__file__).resolve().parents[2]
LORA = LoRARequest("sql", 1, "/adapters/sql")

# The functions that take the request's values one by one: vLLM's call shapes, each of which
# builds one EngineRequest and passes it on.
CALL_SHAPES = {
    "engine/api/engine_client.py:EngineClient.generate",
    "engine/api/async_engine.py:AsyncLLMEngine.generate",
    "engine/core/llm_engine.py:LLMEngine.add_request",
    "gateway/replicas/replicated_engine.py:ReplicatedEngine.generate",
}


def test_it_is_checked_where_it_is_built():
    with pytest.raises(TypeError, match="request_id must be hashable"):
        EngineRequest("hi", None, ["not", "hashable"])
    with pytest.raises(TypeError, match="request_id must be hashable"):
        EngineRequest("hi", None, None)
    for bad in ("high", True, 1.0):
        with pytest.raises(InvalidParam, match="priority must be an integer") as refused:
            EngineRequest("hi", None, "r", priority=bad)
        assert refused.value.field == "priority"
    with pytest.raises(ValueError, match="tenant_weight must be a number > 0"):
        EngineRequest("hi", None, "r", tenant_weight=0)
    with pytest.raises(ValueError, match="tenant_weight must be finite"):
        EngineRequest("hi", None, "r", tenant_weight=float("inf"))


def test_defaults_are_filled_in_once():
    request = EngineRequest("hi", None, 7, tenant_weight=2)
    assert request.sampling_params == SamplingParams()
    assert request.tenant_weight == 2.0 and isinstance(request.tenant_weight, float)
    assert (request.lora_request, request.cache_salt, request.tenant, request.priority) == (
        None,
        None,
        None,
        0,
    )


def test_it_is_frozen_and_crosses_a_process_whole():
    request = EngineRequest(
        {"prompt_token_ids": [1, 2, 3]},
        SamplingParams(temperature=0, max_tokens=4),
        "r-1",
        LORA,
        cache_salt="acme",
        tenant="acme",
        priority=2,
        tenant_weight=0.5,
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        request.priority = 0
    assert pickle.loads(pickle.dumps(request)) == request


def _functions_with_the_values(folder: str) -> set[str]:
    found = set()
    for path in (ROOT / folder).rglob("*.py"):
        tree = ast.parse(path.read_text())
        for cls in [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]:
            for fn in cls.body:
                if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                    continue
                args = fn.args
                names = {a.arg for a in args.args + args.kwonlyargs}
                if "tenant_weight" in names:
                    found.add(f"{path.relative_to(ROOT)}:{cls.name}.{fn.name}")
    return found


def test_only_the_public_call_shapes_take_the_values_one_by_one():
    assert (
        _functions_with_the_values("engine") | _functions_with_the_values("gateway") == CALL_SHAPES
    )
