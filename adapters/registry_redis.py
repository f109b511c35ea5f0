"""The registry store on Redis, so every gateway replica shares adapters, tenants and quotas.

Layout, under `<namespace>:` (a random namespace isolates a test):
  adapters        hash  adapter key -> AdapterMetadata JSON; the key is `<tenant>/<name>`
                        for a tenant's adapter, `<name>` for the operator's (each tenant
                        has its own namespace; see registry_redis_migrate for older data)
  owned:<tenant>  set   adapter names the tenant owns (max_adapters, delete_tenant)
  lora-int-id     int   last lora_int_id handed out; seeded from the clock in milliseconds
                        when missing, so ids handed out after Redis lost its data are still
                        new to every engine that cached weights under an older id
  tenants         hash  name -> TenantRecord JSON
  api-keys        hash  key_id -> StoredKey JSON (salted hashes, never keys)
  usage:<tenant>  hash  `<counter>` totals and `<counter>@<adapter>` per adapter
  usage-tenants   set   tenants with usage counters
  leases:<tenant> zset  lease -> expiry time (concurrent requests)
  reserved:<tenant> hash lease -> tokens its request reserved (counted while the lease lives)
  rpm:<tenant>, tpm:<tenant>  hash  unix second -> requests / tokens in that second
  version         int   bumped by every adapter or tenant change
  epoch           str   random marker written at start-up: its loss means Redis lost data
  events          pub/sub channel of ChangeEvent JSON

Adapter and tenant writes are WATCH/MULTI transactions (retried when another replica
wrote first); quota windows are Lua scripts, so each check-and-count is one atomic step.
Times come from the replica's clock: replicas are assumed NTP-synchronised.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, contextmanager
from functools import wraps
from urllib.parse import urlsplit

import msgspec
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.exceptions import WatchError

from loragate.adapters.api_keys import StoredKey, issue_api_key, parse_api_key, secret_matches
from loragate.adapters.registry_redis_migrate import move_tenant_adapters_to_their_namespaces
from loragate.adapters.registry_store import (
    AdapterMetadata,
    AdapterNameTaken,
    AdapterQuotaExceeded,
    AdapterSpec,
    AdapterWeights,
    Admission,
    ChangeEvent,
    ChangeKind,
    IssuedKey,
    PublicNameTaken,
    Registration,
    RegistryStore,
    RegistryUnavailable,
    StaleAdapterId,
    TenantExists,
    TenantNotFound,
    TenantQuota,
    TenantRecord,
    UsageCounts,
    UsageReport,
    adapter_changes,
    adapter_key,
    check_adapter_key,
    check_count,
    check_lease_ttl,
    check_quota,
    check_tenant_name,
)

_NAMESPACE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,63}")
_UNREACHABLE = (RedisConnectionError, RedisTimeoutError, OSError)
_COUNTERS = UsageCounts.__struct_fields__

# Sliding one-minute windows kept as one counter per unix second (hash field); a window
# hash untouched for 120 s expires.
_WINDOW_LUA = """
local now = tonumber(ARGV[1])
local oldest = math.floor(now) - 59
local function window(key)
  local flat = redis.call('HGETALL', key)
  local total, buckets = 0, {}
  for i = 1, #flat, 2 do
    local second, count = tonumber(flat[i]), tonumber(flat[i + 1])
    if second < oldest then
      redis.call('HDEL', key, flat[i])
    else
      total = total + count
      buckets[#buckets + 1] = {second, count}
    end
  end
  return total, buckets
end
local function seconds_until_below(total, buckets, limit)
  table.sort(buckets, function(a, b) return a[1] < b[1] end)
  local excess = total - limit + 1
  for _, bucket in ipairs(buckets) do
    excess = excess - bucket[2]
    if excess <= 0 then return math.max(1, math.ceil(bucket[1] + 60 - now)) end
  end
  return 60
end
"""

# Reservations of live leases only: a lease that expired (or was removed by in_flight's
# clean-up) frees its reservation here.
_RESERVED_LUA = """
local function live_reservations(leases, reserved)
  local flat = redis.call('HGETALL', reserved)
  local total = 0
  for i = 1, #flat, 2 do
    if redis.call('ZSCORE', leases, flat[i]) then
      total = total + tonumber(flat[i + 1])
    else
      redis.call('HDEL', reserved, flat[i])
    end
  end
  return total
end
"""

# KEYS: leases, rpm, tpm, reserved. ARGV: now, lease, lease expiry, max concurrent, rpm,
# tpm (-1: unlimited), lease key TTL in ms, tokens to reserve, requests to count.
# Returns {admitted 0/1, retry_after, reason}.
_ACQUIRE_LUA = (
    _WINDOW_LUA
    + _RESERVED_LUA
    + """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
local max_concurrent = tonumber(ARGV[4])
if max_concurrent >= 0 and redis.call('ZCARD', KEYS[1]) >= max_concurrent then
  return {0, 1, 'max_concurrent_requests'}
end
local wanted_requests = tonumber(ARGV[9])
local rpm = tonumber(ARGV[5])
local requests, request_buckets = window(KEYS[2])
if rpm >= 0 and requests + wanted_requests > rpm then
  local wait = seconds_until_below(requests, request_buckets, rpm - wanted_requests + 1)
  return {0, wait, 'requests_per_minute'}
end
local wanted_tokens = tonumber(ARGV[8])
local tpm = tonumber(ARGV[6])
if tpm >= 0 then
  local room = tpm - live_reservations(KEYS[1], KEYS[4]) - math.max(wanted_tokens, 1)
  local tokens, token_buckets = window(KEYS[3])
  if tokens > room then
    if room < 0 then return {0, 1, 'tokens_per_minute'} end
    return {0, seconds_until_below(tokens, token_buckets, room + 1), 'tokens_per_minute'}
  end
end
redis.call('ZADD', KEYS[1], ARGV[3], ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[7])
redis.call('HSET', KEYS[4], ARGV[2], wanted_tokens)
redis.call('PEXPIRE', KEYS[4], ARGV[7])
redis.call('HINCRBY', KEYS[2], math.floor(now), wanted_requests)
redis.call('EXPIRE', KEYS[2], 120)
return {1, 0, ''}
"""
)

# KEYS: leases, reserved, tpm. ARGV: now, lease, tokens the request used.
# Returns 1 if the lease was live.
_RELEASE_LUA = (
    _WINDOW_LUA
    + """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[2])
local used = tonumber(ARGV[3])
if used > 0 then
  window(KEYS[3])
  redis.call('HINCRBY', KEYS[3], math.floor(now), used)
  redis.call('EXPIRE', KEYS[3], 120)
end
return redis.call('ZREM', KEYS[1], ARGV[2])
"""
)

# KEYS: tpm. ARGV: now, tokens.
_ADD_TOKENS_LUA = (
    _WINDOW_LUA
    + """
window(KEYS[1])
redis.call('HINCRBY', KEYS[1], math.floor(now), ARGV[2])
redis.call('EXPIRE', KEYS[1], 120)
return 1
"""
)

# KEYS: lora-int-id. ARGV: seed for a missing counter.
_NEW_ID_LUA = """
if redis.call('EXISTS', KEYS[1]) == 0 then redis.call('SET', KEYS[1], ARGV[1]) end
return redis.call('INCR', KEYS[1])
"""

# KEYS: leases, reserved. ARGV: now, lease, new expiry, lease key TTL in ms.
_REFRESH_LUA = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
if not redis.call('ZSCORE', KEYS[1], ARGV[2]) then return 0 end
redis.call('ZADD', KEYS[1], ARGV[3], ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
redis.call('PEXPIRE', KEYS[2], ARGV[4])
return 1
"""


def _redacted(url: str) -> str:
    """The URL without credentials (user, password, query options), for error messages."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return parts._replace(netloc=netloc, query="", fragment="").geturl()


@contextmanager
def _reachable(where: str):
    """Turn every way of not reaching Redis into RegistryUnavailable."""
    try:
        yield
    except _UNREACHABLE as exc:
        raise RegistryUnavailable(f"registry store at {where} is unreachable: {exc}") from exc


def _translated(method: Callable[..., Awaitable]):
    @wraps(method)
    async def wrapper(self: RedisRegistryStore, *args, **kwargs):
        with _reachable(self.where):
            return await method(self, *args, **kwargs)

    return wrapper


def _limit(value: int | None) -> int:
    return -1 if value is None else value


class _Keys:
    def __init__(self, namespace: str):
        ns = namespace
        self.adapters = f"{ns}:adapters"
        self.lora_int_id = f"{ns}:lora-int-id"
        self.tenants = f"{ns}:tenants"
        self.api_keys = f"{ns}:api-keys"
        self.usage_tenants = f"{ns}:usage-tenants"
        self.version = f"{ns}:version"
        self.epoch = f"{ns}:epoch"
        self.events = f"{ns}:events"
        self._ns = ns

    def owned(self, tenant: str) -> str:
        return f"{self._ns}:owned:{tenant}"

    def usage(self, tenant: str) -> str:
        return f"{self._ns}:usage:{tenant}"

    def leases(self, tenant: str) -> str:
        return f"{self._ns}:leases:{tenant}"

    def reserved(self, tenant: str) -> str:
        return f"{self._ns}:reserved:{tenant}"

    def rpm(self, tenant: str) -> str:
        return f"{self._ns}:rpm:{tenant}"

    def tpm(self, tenant: str) -> str:
        return f"{self._ns}:tpm:{tenant}"


class RedisRegistryStore(RegistryStore):
    """The shared store, one per gateway replica.

    A command is retried once, at once, when its connection turns out to be dropped (a
    restarted Redis leaves every pooled connection dead), and never after a timeout, when
    Redis may have run it already: a retried increment could count twice.
    """

    def __init__(
        self,
        url: str,
        namespace: str = "loragate",
        *,
        clock: Callable[[], float] = time.time,
        lease_ttl_s: float = 300.0,
        socket_timeout_s: float = 2.0,
    ):
        if not isinstance(url, str) or urlsplit(url).scheme not in ("redis", "rediss", "unix"):
            raise ValueError(f"redis url must start with redis://, rediss:// or unix://: {url!r}")
        if not isinstance(namespace, str) or not _NAMESPACE.fullmatch(namespace):
            raise ValueError(
                "namespace must be 1-64 letters, digits, '.', '_', ':' or '-', "
                f"starting with a letter or digit; got {namespace!r}"
            )
        self.where = _redacted(url)
        self._clock = clock
        self._lease_ttl = check_lease_ttl(lease_ttl_s)
        self._keys = _Keys(namespace)
        self._socket_timeout = socket_timeout_s
        options = dict(
            decode_responses=True,
            socket_timeout=socket_timeout_s,
            socket_connect_timeout=socket_timeout_s,
        )
        once = Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,))
        self._redis = aioredis.Redis.from_url(url, retry=once, **options)
        # Subscriptions never reconnect silently: a watcher must hear that it may have
        # missed events, so that it resyncs.
        never = Retry(NoBackoff(), 0)
        self._pubsub_redis = aioredis.Redis.from_url(
            url, retry=never, health_check_interval=5, **options
        )
        self._acquire = self._redis.register_script(_ACQUIRE_LUA)
        self._add_tokens = self._redis.register_script(_ADD_TOKENS_LUA)
        self._release = self._redis.register_script(_RELEASE_LUA)
        self._refresh = self._redis.register_script(_REFRESH_LUA)
        self._new_id = self._redis.register_script(_NEW_ID_LUA)
        self._epoch: str | None = None

    async def _transact(self, watched: list[str], body: Callable[..., Awaitable]):
        """Run body(pipe) under WATCH; it reads, then calls pipe.multi() and queues writes.

        Retried from the start when another client changed a watched key meanwhile.
        """
        async with self._redis.pipeline(transaction=True) as pipe:
            while True:
                try:
                    await pipe.watch(*watched)
                    result = await body(pipe)
                    if pipe.explicit_transaction:
                        await pipe.execute()
                    else:
                        await pipe.reset()
                    return result
                except WatchError:
                    continue

    def _announce(self, pipe, kind: ChangeKind, name: str) -> None:
        pipe.incr(self._keys.version)
        pipe.publish(self._keys.events, msgspec.json.encode(ChangeEvent(kind, name)))

    # lifecycle

    async def _current_epoch(self) -> tuple[str, bool]:
        """The epoch marker, written now if missing; and whether it was missing."""
        fresh = uuid.uuid4().hex
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.setnx(self._keys.epoch, fresh).get(self._keys.epoch)
            created, epoch = await pipe.execute()
        return epoch, bool(created)

    @_translated
    async def open(self) -> bool:
        self._epoch, created = await self._current_epoch()
        await move_tenant_adapters_to_their_namespaces(
            self._redis, self._keys.adapters, self._keys.version
        )
        return created

    @_translated
    async def check_reset(self) -> bool:
        epoch, _ = await self._current_epoch()
        known, self._epoch = self._epoch, epoch
        return known is not None and known != epoch

    @_translated
    async def ping(self) -> None:
        await self._redis.ping()

    async def close(self) -> None:
        await self._redis.aclose()
        await self._pubsub_redis.aclose()

    # adapters

    @_translated
    async def new_lora_int_id(self) -> int:
        seed = int(self._clock() * 1000)
        return int(await self._new_id(keys=[self._keys.lora_int_id], args=[seed]))

    @_translated
    async def register_adapter(
        self, spec: AdapterSpec, *, lora_int_id: int | None = None, replace: bool = True
    ) -> Registration:
        if not isinstance(spec, AdapterSpec) or isinstance(spec, AdapterMetadata):
            raise ValueError(f"spec must be an AdapterSpec, got {type(spec).__name__}")
        keys, name, tenant = self._keys, adapter_key(spec.tenant, spec.name), spec.tenant
        if lora_int_id is None:
            lora_int_id = await self.new_lora_int_id()
        check_count("lora_int_id", lora_int_id, minimum=1)
        adapter = AdapterMetadata(
            **msgspec.structs.asdict(spec), lora_int_id=lora_int_id, created_at=self._clock()
        )

        async def body(pipe) -> Registration:
            old = _decode_adapter(await pipe.hget(keys.adapters, name))
            if old is not None and not replace:
                raise AdapterNameTaken(name)
            if spec.public:
                await self._check_public_name(pipe, name, spec.name)
            handed_out = int(await pipe.get(keys.lora_int_id) or 0)
            if lora_int_id > handed_out or (old is not None and old.lora_int_id == lora_int_id):
                raise StaleAdapterId(
                    f"lora_int_id {lora_int_id} was not handed out by new_lora_int_id "
                    "or belongs to the registration being replaced"
                )
            if tenant is not None:
                record = _decode_tenant(await pipe.hget(keys.tenants, tenant))
                if record is None:
                    raise TenantNotFound(tenant)
                limit = record.quota.max_adapters
                owned = await pipe.scard(keys.owned(tenant))
                if old is None and limit is not None and owned >= limit:
                    raise AdapterQuotaExceeded(tenant, limit)
            pipe.multi()
            pipe.hset(keys.adapters, name, msgspec.json.encode(adapter))
            if tenant is not None:
                pipe.sadd(keys.owned(tenant), spec.name)
            self._announce(pipe, ChangeKind.ADAPTER_REGISTERED, name)
            return Registration(adapter, old)

        watched = [keys.adapters] + ([keys.tenants, keys.owned(tenant)] if tenant else [])
        return await self._transact(watched, body)

    async def _check_public_name(self, pipe, key: str, name: str) -> None:
        """Inside a transaction watching the adapters hash: no other public `name`."""
        for raw in (await pipe.hgetall(self._keys.adapters)).values():
            other = _decode_adapter(raw)
            if other.public and other.name == name and other.key != key:
                raise PublicNameTaken(name, other.key)

    @_translated
    async def get_adapter(self, key: str) -> AdapterMetadata | None:
        return _decode_adapter(await self._redis.hget(self._keys.adapters, check_adapter_key(key)))

    @_translated
    async def list_adapters(self) -> list[AdapterMetadata]:
        raw = await self._redis.hgetall(self._keys.adapters)
        return sorted((_decode_adapter(v) for v in raw.values()), key=lambda a: a.key)

    @_translated
    async def update_adapter(
        self,
        key: str,
        *,
        status: str | None = None,
        public: bool | None = None,
        lora_int_id: int | None = None,
        weights: AdapterWeights | None = None,
    ) -> AdapterMetadata | None:
        name = check_adapter_key(key)
        changes = adapter_changes(status, public, weights)

        async def body(pipe) -> AdapterMetadata | None:
            old = _decode_adapter(await pipe.hget(self._keys.adapters, name))
            if old is None or (lora_int_id is not None and old.lora_int_id != lora_int_id):
                return None
            if public:
                await self._check_public_name(pipe, name, old.name)
            new = msgspec.structs.replace(old, **changes)
            pipe.multi()
            pipe.hset(self._keys.adapters, name, msgspec.json.encode(new))
            self._announce(pipe, ChangeKind.ADAPTER_UPDATED, name)
            return new

        return await self._transact([self._keys.adapters], body)

    @_translated
    async def delete_adapter(
        self, key: str, *, lora_int_id: int | None = None
    ) -> AdapterMetadata | None:
        name = check_adapter_key(key)

        async def body(pipe) -> AdapterMetadata | None:
            old = _decode_adapter(await pipe.hget(self._keys.adapters, name))
            if old is None or (lora_int_id is not None and old.lora_int_id != lora_int_id):
                return None
            pipe.multi()
            pipe.hdel(self._keys.adapters, name)
            if old.tenant is not None:
                pipe.srem(self._keys.owned(old.tenant), old.name)
            self._announce(pipe, ChangeKind.ADAPTER_DELETED, name)
            return old

        return await self._transact([self._keys.adapters], body)

    # tenants

    @_translated
    async def create_tenant(self, name: str, quota: TenantQuota | None = None) -> IssuedKey:
        check_tenant_name(name)
        quota = check_quota(quota if quota is not None else TenantQuota())
        api_key, stored = issue_api_key(name)
        tenant = TenantRecord(
            name=name, quota=quota, created_at=self._clock(), key_ids=(stored.key_id,)
        )

        async def body(pipe) -> IssuedKey:
            if await pipe.hexists(self._keys.tenants, name):
                raise TenantExists(name)
            pipe.multi()
            pipe.hset(self._keys.tenants, name, msgspec.json.encode(tenant))
            pipe.hset(self._keys.api_keys, stored.key_id, msgspec.json.encode(stored))
            self._announce(pipe, ChangeKind.TENANT_CREATED, name)
            return IssuedKey(tenant, api_key)

        return await self._transact([self._keys.tenants], body)

    @_translated
    async def get_tenant(self, name: str) -> TenantRecord | None:
        return _decode_tenant(await self._redis.hget(self._keys.tenants, check_tenant_name(name)))

    @_translated
    async def list_tenants(self) -> list[TenantRecord]:
        raw = await self._redis.hgetall(self._keys.tenants)
        return sorted((_decode_tenant(v) for v in raw.values()), key=lambda t: t.name)

    async def _replace_tenant(self, name: str, change: Callable[[TenantRecord], tuple]):
        """Apply change(old) -> (new record, key_ids to drop, StoredKey to add | None)."""
        check_tenant_name(name)

        async def body(pipe) -> TenantRecord:
            old = _decode_tenant(await pipe.hget(self._keys.tenants, name))
            if old is None:
                raise TenantNotFound(name)
            new, dropped, added = change(old)
            pipe.multi()
            pipe.hset(self._keys.tenants, name, msgspec.json.encode(new))
            if dropped:
                pipe.hdel(self._keys.api_keys, *dropped)
            if added is not None:
                pipe.hset(self._keys.api_keys, added.key_id, msgspec.json.encode(added))
            self._announce(pipe, ChangeKind.TENANT_UPDATED, name)
            return new

        return await self._transact([self._keys.tenants], body)

    @_translated
    async def set_tenant_quota(self, name: str, quota: TenantQuota) -> TenantRecord:
        check_quota(quota)
        return await self._replace_tenant(
            name, lambda old: (msgspec.structs.replace(old, quota=quota), (), None)
        )

    @_translated
    async def rotate_tenant_key(self, name: str) -> IssuedKey:
        api_key, stored = issue_api_key(name)
        new = await self._replace_tenant(
            name,
            lambda old: (
                msgspec.structs.replace(old, key_ids=(stored.key_id,)),
                old.key_ids,
                stored,
            ),
        )
        return IssuedKey(new, api_key)

    @_translated
    async def delete_tenant(self, name: str) -> TenantRecord | None:
        keys = self._keys
        check_tenant_name(name)

        async def body(pipe) -> TenantRecord | None:
            tenant = _decode_tenant(await pipe.hget(keys.tenants, name))
            if tenant is None:
                return None
            owned = sorted(adapter_key(name, a) for a in await pipe.smembers(keys.owned(name)))
            records = await pipe.hmget(keys.adapters, owned) if owned else []
            pipe.multi()
            pipe.hdel(keys.tenants, name)
            if tenant.key_ids:
                pipe.hdel(keys.api_keys, *tenant.key_ids)
            for adapter, raw in zip(owned, records, strict=True):
                record = _decode_adapter(raw)
                if record is not None and record.tenant == name:
                    pipe.hdel(keys.adapters, adapter)
                    self._announce(pipe, ChangeKind.ADAPTER_DELETED, adapter)
            pipe.delete(keys.owned(name))
            self._announce(pipe, ChangeKind.TENANT_DELETED, name)
            return tenant

        return await self._transact([keys.tenants, keys.adapters, keys.owned(name)], body)

    @_translated
    async def verify_api_key(self, api_key: str) -> str | None:
        parsed = parse_api_key(api_key)
        if parsed is None:
            return None
        key_id, secret = parsed
        raw = await self._redis.hget(self._keys.api_keys, key_id)
        stored = None if raw is None else msgspec.json.decode(raw, type=StoredKey)
        return stored.tenant if secret_matches(stored, secret) else None

    # usage

    @_translated
    async def record_usage(
        self,
        tenant: str,
        adapter: str | None,
        *,
        prompt_tokens: int,
        completion_tokens: int,
        requests: int = 1,
    ) -> None:
        check_tenant_name(tenant)
        if adapter is not None:
            check_adapter_key(adapter)
        amounts = {
            "prompt_tokens": check_count("prompt_tokens", prompt_tokens),
            "completion_tokens": check_count("completion_tokens", completion_tokens),
            "requests": check_count("requests", requests),
        }
        key = self._keys.usage(tenant)
        async with self._redis.pipeline(transaction=True) as pipe:
            for counter, amount in amounts.items():
                pipe.hincrby(key, counter, amount)
                if adapter is not None:
                    pipe.hincrby(key, f"{counter}@{adapter}", amount)
            pipe.sadd(self._keys.usage_tenants, tenant)
            await pipe.execute()

    @_translated
    async def get_usage(self, tenant: str) -> UsageReport:
        raw = await self._redis.hgetall(self._keys.usage(check_tenant_name(tenant)))
        return _usage_report(tenant, raw)

    @_translated
    async def list_usage(self) -> list[UsageReport]:
        tenants = sorted(await self._redis.smembers(self._keys.usage_tenants))
        async with self._redis.pipeline(transaction=False) as pipe:
            for tenant in tenants:
                pipe.hgetall(self._keys.usage(tenant))
            raws = await pipe.execute()
        return [_usage_report(t, raw) for t, raw in zip(tenants, raws, strict=True)]

    # quotas

    def _lease_key_ttl_ms(self) -> int:
        return int((self._lease_ttl + 60) * 1000)

    @_translated
    async def try_acquire_request(
        self, tenant: str, quota: TenantQuota, *, tokens: int = 0, requests: int = 1
    ) -> Admission:
        check_tenant_name(tenant)
        check_quota(quota)
        check_count("tokens", tokens)
        check_count("requests", requests, minimum=1)
        now, lease = self._clock(), uuid.uuid4().hex
        keys = [
            self._keys.leases(tenant),
            self._keys.rpm(tenant),
            self._keys.tpm(tenant),
            self._keys.reserved(tenant),
        ]
        args = [
            repr(now),
            lease,
            repr(now + self._lease_ttl),
            _limit(quota.max_concurrent_requests),
            _limit(quota.requests_per_minute),
            _limit(quota.tokens_per_minute),
            self._lease_key_ttl_ms(),
            tokens,
            requests,
        ]
        admitted, retry_after, reason = await self._acquire(keys=keys, args=args)
        if admitted:
            return Admission(True, lease=lease)
        return Admission(False, int(retry_after), reason)

    @staticmethod
    def _check_lease(lease: object) -> None:
        if not isinstance(lease, str) or not lease:
            raise ValueError(f"lease must be the non-empty string an Admission gave, got {lease!r}")

    @_translated
    async def release_request(self, tenant: str, lease: str, *, used_tokens: int = 0) -> bool:
        check_tenant_name(tenant)
        self._check_lease(lease)
        check_count("used_tokens", used_tokens)
        keys = [self._keys.leases(tenant), self._keys.reserved(tenant), self._keys.tpm(tenant)]
        args = [repr(self._clock()), lease, used_tokens]
        return bool(await self._release(keys=keys, args=args))

    @_translated
    async def refresh_request(self, tenant: str, lease: str) -> bool:
        check_tenant_name(tenant)
        self._check_lease(lease)
        now = self._clock()
        keys = [self._keys.leases(tenant), self._keys.reserved(tenant)]
        args = [repr(now), lease, repr(now + self._lease_ttl), self._lease_key_ttl_ms()]
        return bool(await self._refresh(keys=keys, args=args))

    @_translated
    async def in_flight(self, tenant: str) -> int:
        key = self._keys.leases(check_tenant_name(tenant))
        async with self._redis.pipeline(transaction=True) as pipe:
            _, count = await pipe.zremrangebyscore(key, "-inf", self._clock()).zcard(key).execute()
        return int(count)

    @_translated
    async def add_tokens(self, tenant: str, tokens: int) -> None:
        check_tenant_name(tenant)
        check_count("tokens", tokens)
        await self._add_tokens(keys=[self._keys.tpm(tenant)], args=[repr(self._clock()), tokens])

    # changes

    @asynccontextmanager
    async def watch(self) -> AsyncIterator[AsyncIterator[ChangeEvent]]:
        pubsub = self._pubsub_redis.pubsub(ignore_subscribe_messages=False)
        try:
            with _reachable(self.where):
                await pubsub.subscribe(self._keys.events)
                await self._until_subscribed(pubsub)
            yield _EventFeed(pubsub, self.where)
        finally:
            try:
                await pubsub.aclose()
            except _UNREACHABLE:
                pass  # the subscription is gone either way

    async def _until_subscribed(self, pubsub) -> None:
        """Wait for Redis to confirm, so no change made after watch() returns is missed."""
        while True:
            message = await pubsub.get_message(timeout=self._socket_timeout)
            if message is None:
                raise RegistryUnavailable(f"registry store at {self.where} did not confirm")
            if message["type"] == "subscribe":
                return

    @_translated
    async def version(self) -> int:
        return int(await self._redis.get(self._keys.version) or 0)


class _EventFeed:
    """The change events of one subscription, as an async iterator."""

    def __init__(self, pubsub, where: str):
        self._pubsub = pubsub
        self._where = where

    def __aiter__(self) -> _EventFeed:
        return self

    async def __anext__(self) -> ChangeEvent:
        while True:
            with _reachable(self._where):
                message = await self._pubsub.get_message(
                    ignore_subscribe_messages=True, timeout=1.0
                )
            if message is not None and message["type"] == "message":
                return msgspec.json.decode(message["data"], type=ChangeEvent)


def _decode_adapter(raw: str | None) -> AdapterMetadata | None:
    return None if raw is None else msgspec.json.decode(raw, type=AdapterMetadata)


def _decode_tenant(raw: str | None) -> TenantRecord | None:
    return None if raw is None else msgspec.json.decode(raw, type=TenantRecord)


def _usage_report(tenant: str, raw: dict[str, str]) -> UsageReport:
    total = {c: int(raw.get(c, 0)) for c in _COUNTERS}
    per_adapter: dict[str, dict[str, int]] = {}
    for field, value in raw.items():
        counter, sep, adapter = field.partition("@")
        if sep and counter in _COUNTERS:
            per_adapter.setdefault(adapter, {})[counter] = int(value)
    by_adapter = {name: UsageCounts(**per_adapter[name]) for name in sorted(per_adapter)}
    return UsageReport(tenant, UsageCounts(**total), by_adapter)
