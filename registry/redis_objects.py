"""The Redis store's adapter-object pins and claims (a part of RedisRegistryStore); see
registry/adapter_objects.py for what they mean. Each check-and-mark is one Lua script, so
replicas cannot both pass it.

Keys, under `<namespace>:`: `object-pins:<id>` (zset: pin -> expiry), `object-claim:<id>`
(string with a TTL: the deleting replica's mark).
"""

from __future__ import annotations

import uuid

from loragate.registry.records import check_lease_ttl, check_store_object
from loragate.registry.redis_wire import translated

# KEYS: pins, claim. ARGV: now, pin, expiry, key TTL in ms. Returns 1 when pinned.
PIN_LUA = """
if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
redis.call('ZADD', KEYS[1], ARGV[3], ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return 1
"""

# KEYS: object-refs, pins, claim. ARGV: now, object id, claim TTL in ms, claim token.
# Returns 1 when claimed: no adapter record references the object (its count in object-refs,
# kept with the records), no live pin, no claim. A count at zero is dropped with the claim.
CLAIM_LUA = """
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', ARGV[1])
if redis.call('ZCARD', KEYS[2]) > 0 then return 0 end
if redis.call('EXISTS', KEYS[3]) == 1 then return 0 end
if tonumber(redis.call('HGET', KEYS[1], ARGV[2]) or '0') > 0 then return 0 end
redis.call('HDEL', KEYS[1], ARGV[2])
redis.call('SET', KEYS[3], ARGV[4], 'PX', ARGV[3])
return 1
"""


class RedisObjects:
    """Mixed into RedisRegistryStore: needs its `_redis`, `_keys`, `_clock` and the scripts
    `_pin_object` (PIN_LUA) and `_claim_object` (CLAIM_LUA) it registers."""

    def _object_keys(self, oid: str) -> tuple[str, str]:
        check_store_object(oid)
        return self._keys.object_pins(oid), self._keys.object_claim(oid)

    @translated
    async def pin_object(self, oid: str, ttl_s: float = 600.0) -> str | None:
        pins, claim = self._object_keys(oid)
        token, now = uuid.uuid4().hex, self._clock()
        ttl = check_lease_ttl(ttl_s)
        args = [now, token, now + ttl, int(ttl * 1000) + 1000]
        return token if await self._pin_object(keys=[pins, claim], args=args) else None

    @translated
    async def unpin_object(self, oid: str, token: str) -> None:
        pins, _ = self._object_keys(oid)
        await self._redis.zrem(pins, token)

    @translated
    async def claim_unreferenced_object(self, oid: str, ttl_s: float = 60.0) -> bool:
        pins, claim = self._object_keys(oid)
        ttl_ms = int(check_lease_ttl(ttl_s) * 1000)
        args = [self._clock(), oid, ttl_ms, uuid.uuid4().hex]
        keys = [self._keys.object_refs, pins, claim]
        return bool(await self._claim_object(keys=keys, args=args))

    @translated
    async def release_object_claim(self, oid: str) -> None:
        _, claim = self._object_keys(oid)
        await self._redis.delete(claim)

    @translated
    async def object_references(self, oid: str) -> int:
        check_store_object(oid)
        return int(await self._redis.hget(self._keys.object_refs, oid) or 0)
