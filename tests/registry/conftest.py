"""Fixtures of the contract for every registry store: the in-memory one and Redis (a real server).

Each test gets `store` and `peer`: two handles on one registry. For Redis they are two
store objects with their own connections (two gateway replicas); in memory, one object.
Redis runs in a random namespace, deleted afterwards. If Redis is not reachable on
127.0.0.1:6379 the Redis tests fail: CI starts one (.ci/run).
"""

from __future__ import annotations

import uuid

import pytest
from registry_testlib import Backend, FakeClock
from services_testlib import REDIS_URL, flush_namespace, require_redis

from loragate.registry.memory import MemoryRegistryStore
from loragate.registry.redis_store import RedisRegistryStore


@pytest.fixture
def redis_namespace():
    require_redis(REDIS_URL, who="The registry contract tests")
    namespace = f"test-registry-{uuid.uuid4().hex}"
    yield namespace
    flush_namespace(namespace)


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture(params=["memory", "redis"])
async def backend(request, clock):
    if request.param == "memory":
        store = MemoryRegistryStore(clock=clock, lease_ttl_s=30)
        backend = Backend("memory", store, store)
    else:
        namespace = request.getfixturevalue("redis_namespace")
        store, peer = (
            RedisRegistryStore(REDIS_URL, namespace, clock=clock, lease_ttl_s=30) for _ in range(2)
        )
        backend = Backend("redis", store, peer, namespace)
    assert await backend.store.open() is True
    yield backend
    await backend.store.close()
    await backend.peer.close()


@pytest.fixture
def store(backend):
    return backend.store


@pytest.fixture
def peer(backend):
    return backend.peer
