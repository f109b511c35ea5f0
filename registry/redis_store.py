"""The registry store on Redis, so every gateway replica shares adapters, tenants and quotas.

Layout, under `<namespace>:` (a random namespace isolates a test):
  adapters        hash  adapter key -> AdapterMetadata JSON; the key is `<tenant>/<name>`
                        for a tenant's adapter, `<name>` for the operator's (each tenant
                        has its own namespace; see redis_migrate for older data)
  adapter-index, owned:<tenant>, adapter-totals:<tenant>, public-names, public-index,
  object-refs, changes   the indexes and the change log, written in the same MULTI as the
                        records (see redis_index)
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
  object-pins:<id>  zset  upload pin -> expiry, on an adapter store object (redis_objects)
  object-claim:<id> str   the one replica deleting that object's bytes (with a TTL)
  version         int   bumped by every adapter or tenant change (and logged in `changes`)
  epoch           str   random marker written at start-up: its loss means Redis lost data
  events          pub/sub channel of ChangeEvent JSON
  staging:<id>:*  a restore's records while it is written, before its switch (expire by
                  themselves if the importer dies; see redis_restore)

Adapter and tenant writes are WATCH/MULTI transactions (retried when another replica
wrote first); quota windows are Lua scripts, so each check-and-count is one atomic step.
Times come from the replica's clock: replicas are assumed NTP-synchronised.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from urllib.parse import urlsplit

import msgspec
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import WatchError

from loragate.registry.adapter_index import (
    DEFAULT_CHANGE_LOG_SIZE,
    DEFAULT_PAGE_SIZE,
    AdapterCounts,
    AdapterPage,
    ChangeLog,
    LoggedChange,
    check_page,
)
from loragate.registry.adapter_objects import check_adapter_room
from loragate.registry.errors import (
    AdapterNameTaken,
    PublicNameTaken,
    RegistryUnavailable,
    StaleAdapterId,
    TenantNotFound,
)
from loragate.registry.names import (
    adapter_key,
    check_adapter_key,
    check_adapter_name,
    check_namespace,
    check_tenant_name,
)
from loragate.registry.records import (
    AdapterMetadata,
    AdapterSpec,
    AdapterWeights,
    ChangeEvent,
    ChangeKind,
    Registration,
    adapter_changes,
    check_count,
    check_lease_ttl,
)
from loragate.registry.redis_backup import RedisBackup
from loragate.registry.redis_index import (
    ANNOUNCE_LUA,
    CHANGES_LUA,
    PAGE_LUA,
    PUBLIC_LUA,
    VISIBLE_PAGE_LUA,
    queue_put,
    queue_remove,
)
from loragate.registry.redis_lua import (
    ACQUIRE_LUA,
    ADD_TOKENS_LUA,
    NEW_ID_LUA,
    REFRESH_LUA,
    RELEASE_LUA,
)
from loragate.registry.redis_migrate import upgrade_layout
from loragate.registry.redis_objects import CLAIM_LUA, PIN_LUA, RedisObjects
from loragate.registry.redis_restore import RESTORE_BATCH
from loragate.registry.redis_tenants import RedisTenants
from loragate.registry.redis_usage import RedisUsageAndQuotas
from loragate.registry.redis_wire import (
    UNREACHABLE,
    EventFeed,
    Keys,
    decode_adapter,
    decode_counts,
    decode_tenant,
    reachable,
    redacted,
    translated,
)
from loragate.registry.store import RegistryStore

_TOTALS = ("adapters", "size_bytes")


class RedisRegistryStore(
    RedisObjects, RedisTenants, RedisUsageAndQuotas, RedisBackup, RegistryStore
):
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
        change_log_size: int = DEFAULT_CHANGE_LOG_SIZE,
        batch_records: int = RESTORE_BATCH,
    ):
        if not isinstance(url, str) or urlsplit(url).scheme not in ("redis", "rediss", "unix"):
            raise ValueError(f"redis url must start with redis://, rediss:// or unix://: {url!r}")
        check_namespace(namespace)
        self.where = redacted(url)
        self._clock = clock
        self._lease_ttl = check_lease_ttl(lease_ttl_s)
        self._keys = Keys(namespace)
        self._change_log_size = check_count("change_log_size", change_log_size, minimum=1)
        self._batch_records = check_count("batch_records", batch_records, minimum=1)
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
        self._acquire = self._redis.register_script(ACQUIRE_LUA)
        self._add_tokens = self._redis.register_script(ADD_TOKENS_LUA)
        self._release = self._redis.register_script(RELEASE_LUA)
        self._refresh = self._redis.register_script(REFRESH_LUA)
        self._new_id = self._redis.register_script(NEW_ID_LUA)
        self._pin_object = self._redis.register_script(PIN_LUA)
        self._claim_object = self._redis.register_script(CLAIM_LUA)
        self._announce_script = self._redis.register_script(ANNOUNCE_LUA)
        self._page = self._redis.register_script(PAGE_LUA)
        self._visible_page = self._redis.register_script(VISIBLE_PAGE_LUA)
        self._public = self._redis.register_script(PUBLIC_LUA)
        self._changes = self._redis.register_script(CHANGES_LUA)
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
        """Queue, in the caller's MULTI: bump the version, log the change, publish it."""
        keys = [self._keys.version, self._keys.changes, self._keys.events]
        args = [str(kind), name, self._change_log_size]
        pipe.scripts.add(self._announce_script)  # loaded (if need be) before the MULTI
        pipe.evalsha(self._announce_script.sha, len(keys), *keys, *args)

    # lifecycle

    async def _current_epoch(self) -> tuple[str, bool]:
        """The epoch marker, written now if missing; and whether it was missing."""
        fresh = uuid.uuid4().hex
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.setnx(self._keys.epoch, fresh).get(self._keys.epoch)
            created, epoch = await pipe.execute()
        return epoch, bool(created)

    @translated
    async def open(self) -> bool:
        self._epoch, created = await self._current_epoch()
        await upgrade_layout(self._redis, self._keys, self._keys.namespace)
        return created

    @translated
    async def check_reset(self) -> bool:
        epoch, _ = await self._current_epoch()
        known, self._epoch = self._epoch, epoch
        return known is not None and known != epoch

    @translated
    async def ping(self) -> None:
        await self._redis.ping()

    async def close(self) -> None:
        await self._redis.aclose()
        await self._pubsub_redis.aclose()

    # adapters

    @translated
    async def new_lora_int_id(self) -> int:
        seed = int(self._clock() * 1000)
        return int(await self._new_id(keys=[self._keys.lora_int_id], args=[seed]))

    @translated
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
            old = decode_adapter(await pipe.hget(keys.adapters, name))
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
                record = decode_tenant(await pipe.hget(keys.tenants, tenant))
                if record is None:
                    raise TenantNotFound(tenant)
                counts = decode_counts(await pipe.hmget(keys.adapter_totals(tenant), *_TOTALS))
                check_adapter_room(record, counts, old, spec)
            pipe.multi()
            queue_put(pipe, keys, old, adapter)
            self._announce(pipe, ChangeKind.ADAPTER_REGISTERED, name)
            return Registration(adapter, old)

        watched = [keys.adapters, keys.public_names]
        if tenant is not None:
            watched += [keys.tenants, keys.adapter_totals(tenant)]
        return await self._transact(watched, body)

    async def _check_public_name(self, pipe, key: str, name: str) -> None:
        """Inside a transaction watching public-names: no other public `name`."""
        other = await pipe.hget(self._keys.public_names, name)
        if other is not None and other != key:
            raise PublicNameTaken(name, other)

    @translated
    async def get_adapter(self, key: str) -> AdapterMetadata | None:
        return decode_adapter(await self._redis.hget(self._keys.adapters, check_adapter_key(key)))

    @translated
    async def get_adapters(self, keys: list[str]) -> list[AdapterMetadata | None]:
        if not keys:
            return []
        raw = await self._redis.hmget(self._keys.adapters, [check_adapter_key(k) for k in keys])
        return [decode_adapter(r) for r in raw]

    @translated
    async def list_adapters(self) -> list[AdapterMetadata]:
        raw = await self._redis.hgetall(self._keys.adapters)
        return sorted((decode_adapter(v) for v in raw.values()), key=lambda a: a.key)

    @translated
    async def public_adapter(self, name: str) -> AdapterMetadata | None:
        keys = [self._keys.public_names, self._keys.adapters]
        return decode_adapter(await self._public(keys=keys, args=[check_adapter_name(name)]))

    @translated
    async def adapter_counts(self, tenant: str) -> AdapterCounts:
        totals = self._keys.adapter_totals(check_tenant_name(tenant))
        return decode_counts(await self._redis.hmget(totals, *_TOTALS))

    @translated
    async def page_adapters(
        self, *, after: str | None = None, limit: int = DEFAULT_PAGE_SIZE
    ) -> AdapterPage:
        after, limit = check_page(after, limit)
        keys = [self._keys.adapter_index, self._keys.adapters]
        more, raw = await self._page(keys=keys, args=[after or "", limit])
        return AdapterPage(tuple(decode_adapter(r) for r in raw if r is not None), bool(more))

    @translated
    async def page_visible_adapters(
        self, tenant: str, *, after: str | None = None, limit: int = DEFAULT_PAGE_SIZE
    ) -> AdapterPage:
        after, limit = check_page(after, limit)
        k = self._keys
        keys = [k.owned(check_tenant_name(tenant)), k.public_index, k.public_names, k.adapters]
        more, raw = await self._visible_page(keys=keys, args=[after or "", limit, tenant])
        return AdapterPage(tuple(decode_adapter(r) for r in raw if r is not None), bool(more))

    @translated
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
            old = decode_adapter(await pipe.hget(self._keys.adapters, name))
            if old is None or (lora_int_id is not None and old.lora_int_id != lora_int_id):
                return None
            if public:
                await self._check_public_name(pipe, name, old.name)
            new = msgspec.structs.replace(old, **changes)
            pipe.multi()
            queue_put(pipe, self._keys, old, new)
            self._announce(pipe, ChangeKind.ADAPTER_UPDATED, name)
            return new

        return await self._transact([self._keys.adapters, self._keys.public_names], body)

    @translated
    async def delete_adapter(
        self, key: str, *, lora_int_id: int | None = None
    ) -> AdapterMetadata | None:
        name = check_adapter_key(key)

        async def body(pipe) -> AdapterMetadata | None:
            old = decode_adapter(await pipe.hget(self._keys.adapters, name))
            if old is None or (lora_int_id is not None and old.lora_int_id != lora_int_id):
                return None
            pipe.multi()
            queue_remove(pipe, self._keys, old)
            self._announce(pipe, ChangeKind.ADAPTER_DELETED, name)
            return old

        return await self._transact([self._keys.adapters], body)

    # changes

    @asynccontextmanager
    async def watch(self) -> AsyncIterator[AsyncIterator[ChangeEvent]]:
        pubsub = self._pubsub_redis.pubsub(ignore_subscribe_messages=False)
        try:
            with reachable(self.where):
                await pubsub.subscribe(self._keys.events)
                await self._until_subscribed(pubsub)
            yield EventFeed(pubsub, self.where)
        finally:
            try:
                await pubsub.aclose()
            except UNREACHABLE:
                pass  # the subscription is gone either way

    async def _until_subscribed(self, pubsub) -> None:
        """Wait for Redis to confirm, so no change made after watch() returns is missed."""
        while True:
            message = await pubsub.get_message(timeout=self._socket_timeout)
            if message is None:
                raise RegistryUnavailable(f"registry store at {self.where} did not confirm")
            if message["type"] == "subscribe":
                return

    @translated
    async def version(self) -> int:
        return int(await self._redis.get(self._keys.version) or 0)

    @translated
    async def changes_since(self, version: int, *, limit: int = 1000) -> ChangeLog:
        check_count("version", version)
        check_count("limit", limit, minimum=1)
        keys = [self._keys.version, self._keys.changes]
        latest, complete, raw = await self._changes(keys=keys, args=[version, limit])
        logged = [msgspec.json.decode(r, type=LoggedChange) for r in raw]
        events = tuple(ChangeEvent(c.kind, c.name) for c in logged)
        upto = logged[-1].version if logged and len(logged) == limit else int(latest)
        return ChangeLog(upto, int(latest), events, bool(complete))
