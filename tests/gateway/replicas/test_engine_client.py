"""EngineClient (loragate.engine) is the one engine surface the gateway uses: the in-process
AsyncLLMEngine and the Ray Serve ReplicatedEngine implement every member of it with the
same signature, so no route can work on one and fail on the other (issue 35: chat through
`--replicas` failed on a drifted `apply_chat_template`)."""

from __future__ import annotations

import inspect
import pathlib
import re

import pytest

from loragate.engine import AsyncLLMEngine, EngineClient
from loragate.gateway.replicas.replicated_engine import ReplicatedEngine

IMPLEMENTATIONS = [AsyncLLMEngine, ReplicatedEngine]
GATEWAY = pathlib.Path(__file__).resolve().parents[3] / "gateway"


def protocol_members() -> dict[str, object]:
    members = {}
    for name, value in vars(EngineClient).items():
        if name.startswith("_"):
            continue
        if isinstance(value, property) or inspect.isfunction(value):
            members[name] = value
    return members


def test_the_protocol_names_what_the_gateway_calls():
    assert {"generate", "abort", "apply_chat_template", "encode", "stats"} <= set(
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
    elif name == "generate":
        assert inspect.isasyncgenfunction(own), f"{impl.__name__}.generate must stream"
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
    assert sorted(set(users)) == ["operations/app.py", "replicas/engine_replica.py"], users
