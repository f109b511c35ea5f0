"""What the registry contract tests share: the two backends (memory, a real Redis), a clock
the quota windows see, and builders. Imported by bare name: pytest puts tests/registry on
sys.path."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import msgspec
import redis
from services_testlib import REDIS_URL

from loragate.registry import (
    AdapterSpec,
    ChangeEvent,
    RegistryStore,
)

EVENT_DEADLINE_S = 1.0  # the bound for a replica to see a change


class FakeClock:
    """Time the quota windows see; tests move it instead of sleeping."""

    def __init__(self, now: float = 1_700_000_000.25):
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@dataclass
class Backend:
    kind: str
    store: RegistryStore
    peer: RegistryStore
    namespace: str | None = None

    def raw_dump(self) -> str:
        """Everything the store keeps, as text, to search for secrets."""
        if self.kind == "redis":
            return redis_dump(self.namespace)
        return "\n".join(_strings_in(self.store, set()))


def redis_dump(namespace: str) -> str:
    client = redis.Redis.from_url(REDIS_URL, decode_responses=True)
    parts = []
    for key in client.scan_iter(match=f"{namespace}:*"):
        parts.append(key)
        kind = client.type(key)
        if kind == "hash":
            parts += [f"{k}={v}" for k, v in client.hgetall(key).items()]
        elif kind == "set":
            parts += client.smembers(key)
        elif kind == "zset":
            parts += client.zrange(key, 0, -1)
        elif kind == "string":
            parts.append(client.get(key))
    client.close()
    return "\n".join(parts)


def _strings_in(obj, seen: set[int]) -> list[str]:
    """Every str/bytes reachable from a loragate object through containers and fields."""
    if isinstance(obj, str):
        return [obj]
    if isinstance(obj, bytes):
        return [obj.hex(), obj.decode("latin-1")]
    if id(obj) in seen:
        return []
    seen.add(id(obj))
    if isinstance(obj, dict):
        items = [*obj.keys(), *obj.values()]
    elif isinstance(obj, list | tuple | set | frozenset):
        items = list(obj)
    elif isinstance(obj, msgspec.Struct):
        items = [getattr(obj, f) for f in obj.__struct_fields__]
    elif type(obj).__module__.startswith("loragate") and hasattr(obj, "__dict__"):
        items = list(vars(obj).values())
    else:
        return []
    return [s for item in items for s in _strings_in(item, seen)]


def spec(name: str = "sql", tenant: str | None = None, **overrides) -> AdapterSpec:
    fields = dict(
        name=name,
        tenant=tenant,
        base_model="tiny-llama",
        rank=8,
        alpha=16,
        target_modules=("q_proj", "v_proj"),
        sha256="ab" * 32,
        size_bytes=1234,
        path=f"adapters/{name}",
    )
    fields.update(overrides)
    return AdapterSpec(**fields)


async def next_event(events) -> ChangeEvent:
    return await asyncio.wait_for(anext(events), EVENT_DEADLINE_S)
