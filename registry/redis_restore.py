"""The Redis store's restore of a backup: written in bounded batches where no reader looks,
then made visible in one small atomic step.

A backup of 100,000 adapters is some 300,000 writes (a record, its indexes, its counters).
In one MULTI they must all travel and run within one socket timeout, which a loaded machine
does not give; written to the live keys in batches, readers would see half an import. So a
restore has three steps:

1. begin: read the store's version, the fence. Each live key the import changes is first
   copied (COPY) into a staging area, `<namespace>:staging:<id>:<key>`, which no reader
   reads: the hashes of adapters, tenants and keys, the indexes, and (as the batches reach
   them) the owned set and counters of each tenant the import adds adapters to.
2. write: tenants, keys, adapter records with their indexes and counters, and usage counts
   go into the staging area `batch` records at a time, one MULTI of a few commands each
   (every record, index and counter key written once per batch), so no round trip grows
   with the backup. Every staged key expires after `ttl_s` unless the switch takes it: an
   importer that dies leaves nothing behind.
3. switch: one script checks that the version is still the fence (no adapter or tenant
   changed since begin: every such change bumps it, so the copies are still the live keys'
   content), renames each staged key over its live key (usage counts are added to the live
   ones), raises the lora_int_id counter and announces REGISTRY_RESTORED, once. Readers see
   the old registry or the new one, never a mix. It costs a rename per staged key (a few
   per tenant the import touches), never one per record.

Any failure before the switch (the fence moved: RegistryChanged; Redis gone) deletes the
staging area, and the live registry stays as it was.
"""

from __future__ import annotations

import uuid

import msgspec

from loragate.registry.errors import RegistryChanged, RegistryError
from loragate.registry.records import RESTORED_NAME, ChangeKind
from loragate.registry.redis_index import ANNOUNCE_FUNCTION, queue_put_many
from loragate.registry.redis_wire import Keys, decode_adapter
from loragate.registry.snapshot import RegistrySnapshot

RESTORE_BATCH = 2000  # records written (or read, by a snapshot) in one round trip
STAGING_TTL_S = 3600.0

# copy(manifest, live prefix, staging prefix, TTL in ms, suffixes, from): each live key
# that exists copied to the staging area and entered in the manifest; returns those.
_COPY_FUNCTION = """
local function copy(manifest, live_prefix, staged_prefix, ttl, suffixes, from)
  local copied = {}
  for i = from, #suffixes do
    local live, staged = live_prefix .. suffixes[i], staged_prefix .. suffixes[i]
    if redis.call('EXISTS', live) == 1 then
      redis.call('COPY', live, staged, 'REPLACE')
      redis.call('PEXPIRE', staged, ttl)
      redis.call('SADD', manifest, suffixes[i])
      redis.call('PEXPIRE', manifest, ttl)
      copied[#copied + 1] = suffixes[i]
    end
  end
  return copied
end
"""

# KEYS: version, manifest. ARGV: expected version ('': any), live prefix, staging prefix,
# TTL in ms, key suffixes to copy. Returns {1, version, {copied...}}; {0, version} off the
# fence.
BEGIN_LUA = (
    _COPY_FUNCTION
    + """
local version = tonumber(redis.call('GET', KEYS[1]) or '0')
if ARGV[1] ~= '' and tonumber(ARGV[1]) ~= version then return {0, version, {}} end
return {1, version, copy(KEYS[2], ARGV[2], ARGV[3], ARGV[4], ARGV, 5)}
"""
)

# KEYS: manifest. ARGV: live prefix, staging prefix, TTL in ms, key suffixes to copy.
# Returns the suffixes copied.
COPY_LUA = _COPY_FUNCTION + "return copy(KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV, 4)\n"

# KEYS: version, changes, events, lora-int-id, usage-tenants, manifest. ARGV: the fence,
# live prefix, staging prefix, staged key count, lowest lora_int_id counter, log size,
# kind, name. Returns {1, new version}; {0, version} off the fence; {-1, 0} if staged keys
# are missing (expired), changing nothing.
SWITCH_LUA = (
    ANNOUNCE_FUNCTION
    + """
local version = tonumber(redis.call('GET', KEYS[1]) or '0')
if version ~= tonumber(ARGV[1]) then return {0, version} end
local suffixes = redis.call('SMEMBERS', KEYS[6])
if #suffixes ~= tonumber(ARGV[4]) then return {-1, 0} end
for _, suffix in ipairs(suffixes) do
  if redis.call('EXISTS', ARGV[3] .. suffix) == 0 then return {-1, 0} end
end
for _, suffix in ipairs(suffixes) do
  local live, staged = ARGV[2] .. suffix, ARGV[3] .. suffix
  local usage = string.sub(suffix, 1, 6) == 'usage:'
  if usage then redis.call('SADD', KEYS[5], string.sub(suffix, 7)) end
  if usage and redis.call('EXISTS', live) == 1 then
    local flat = redis.call('HGETALL', staged)
    for i = 1, #flat, 2 do redis.call('HINCRBY', live, flat[i], flat[i + 1]) end
    redis.call('DEL', staged)
  else
    redis.call('UNLINK', live)
    redis.call('RENAME', staged, live)
    redis.call('PERSIST', live)
  end
end
redis.call('DEL', KEYS[6])
if tonumber(redis.call('GET', KEYS[4]) or '0') < tonumber(ARGV[5]) then
  redis.call('SET', KEYS[4], ARGV[5])
end
return {1, announce(KEYS[1], KEYS[2], KEYS[3], ARGV[7], ARGV[8], ARGV[6])}
"""
)


class StagingExpired(RegistryError):
    """The staging area expired before the switch (an import slower than its TTL)."""


class StagedRestore:
    """One restore of `snapshot` into the store under `keys` (see the module's docstring):
    `begin`, `write`, `switch`; `abandon` deletes the staging area. `run` does all four."""

    def __init__(
        self,
        redis,
        keys: Keys,
        snapshot: RegistrySnapshot,
        *,
        change_log_size: int,
        batch: int = RESTORE_BATCH,
        ttl_s: float = STAGING_TTL_S,
    ):
        self._redis = redis
        self._live = keys
        self._snapshot = snapshot
        self._log_size = change_log_size
        self._batch = batch
        self._ttl_ms = int(ttl_s * 1000)
        self.id = uuid.uuid4().hex
        self.staged = Keys(f"{keys.namespace}:staging:{self.id}")
        self._live_prefix = f"{keys.namespace}:"
        self._staged_prefix = f"{self.staged.namespace}:"
        self._manifest = f"{self._staged_prefix}manifest"
        self._marked: set[str] = set()  # suffixes in the manifest
        self._tenants_copied: set[str] = set()
        self.fence: int | None = None
        self._copy = redis.register_script(COPY_LUA)

    def _suffix(self, key: str) -> str:
        """A staged or live key's name within its area (`adapters`, `owned:<tenant>`...)."""
        if key.startswith(self._staged_prefix):
            return key[len(self._staged_prefix) :]
        return key.removeprefix(self._live_prefix)

    async def run(self, expect_version: int | None) -> int:
        """The whole restore; the version it made (RegistryChanged if the fence moved)."""
        try:
            await self.begin(expect_version)
            await self.write()
            return await self.switch()
        except BaseException:
            await self.abandon()
            raise

    async def begin(self, expect_version: int | None) -> int:
        """Read the fence and stage copies of the global keys the import changes."""
        snapshot, live = self._snapshot, self._live
        shared = []
        if snapshot.tenants:
            shared.append(live.tenants)
        if snapshot.keys:
            shared.append(live.api_keys)
        if snapshot.adapters:
            shared += [
                live.adapters,
                live.adapter_index,
                live.public_names,
                live.public_index,
                live.object_refs,
            ]
        suffixes = [self._suffix(key) for key in shared]
        expected = "" if expect_version is None else str(expect_version)
        args = [expected, self._live_prefix, self._staged_prefix, self._ttl_ms, *suffixes]
        ok, version, copied = await self._redis.eval(
            BEGIN_LUA, 2, live.version, self._manifest, *args
        )
        if not ok:
            raise RegistryChanged(_changed(expect_version, version))
        self._marked.update(copied)
        self.fence = int(version)
        return self.fence

    async def write(self) -> None:
        """Every record of the snapshot into the staging area, `batch` at a time."""
        snapshot, staged, size = self._snapshot, self.staged, self._batch
        encode = msgspec.json.encode
        for part in _parts(snapshot.tenants, size):
            await self._write_hash(staged.tenants, {t.name: encode(t) for t in part})
        for part in _parts(snapshot.keys, size):
            await self._write_hash(staged.api_keys, {k.key_id: encode(k) for k in part})
        for part in _parts(snapshot.adapters, size):
            await self._write_adapters(part)
        for part in _parts(snapshot.usage, max(1, size // 10)):
            await self._write_usage(part)

    async def _write_hash(self, key: str, mapping: dict) -> None:
        def queue(pipe) -> list[str]:
            pipe.hset(key, mapping=mapping)
            return [key]

        await self._commit(queue)

    async def _write_adapters(self, part) -> None:
        staged = self.staged
        olds = await self._redis.hmget(staged.adapters, [a.key for a in part])
        pairs = [(decode_adapter(raw), new) for raw, new in zip(olds, part, strict=True)]
        tenants = sorted({a.tenant for a in part if a.tenant is not None})
        live = self._live
        new_tenants = [t for t in tenants if t not in self._tenants_copied]
        if new_tenants:  # their indexes, before the first write to them
            copies = [live.owned(t) for t in new_tenants]
            copies += [live.adapter_totals(t) for t in new_tenants]
            args = [self._live_prefix, self._staged_prefix, self._ttl_ms]
            args += [self._suffix(key) for key in copies]
            self._marked.update(await self._copy(keys=[self._manifest], args=args))
            self._tenants_copied.update(new_tenants)

        def queue(pipe) -> list[str]:
            return queue_put_many(pipe, staged, pairs)

        await self._commit(queue)

    async def _write_usage(self, part) -> None:
        staged = self.staged

        def queue(pipe) -> list[str]:
            written = []
            for report in part:
                key = staged.usage(report.tenant)
                counters = [("", report.total)]
                counters += [(f"@{name}", c) for name, c in report.by_adapter.items()]
                for suffix, counts in counters:
                    for counter, amount in msgspec.structs.asdict(counts).items():
                        pipe.hincrby(key, counter + suffix, amount)
                written.append(key)
            return written

        await self._commit(queue)

    async def _commit(self, queue) -> None:
        """One MULTI: `queue(pipe)`'s writes (it returns the keys it wrote), those keys
        entered in the manifest, and every one's expiry renewed."""
        async with self._redis.pipeline(transaction=True) as pipe:
            written = queue(pipe)
            suffixes = [self._suffix(key) for key in written]
            new = [s for s in suffixes if s not in self._marked]
            if new:
                pipe.sadd(self._manifest, *new)
            for key in written:
                pipe.pexpire(key, self._ttl_ms)
            pipe.pexpire(self._manifest, self._ttl_ms)
            await pipe.execute()
            self._marked.update(new)

    async def switch(self) -> int:
        """Make the staged registry the live one in one step; the new version."""
        live = self._live
        keys = [
            live.version,
            live.changes,
            live.events,
            live.lora_int_id,
            live.usage_tenants,
            self._manifest,
        ]
        args = [
            self.fence,
            self._live_prefix,
            self._staged_prefix,
            len(self._marked),
            self._snapshot.highest_lora_int_id,
            self._log_size,
            str(ChangeKind.REGISTRY_RESTORED),
            RESTORED_NAME,
        ]
        done, version = await self._redis.eval(SWITCH_LUA, len(keys), *keys, *args)
        if done == 0:
            raise RegistryChanged(_changed(self.fence, version))
        if done < 0:
            raise StagingExpired(
                f"the import's staged records expired (after {self._ttl_ms // 1000} s) "
                "before they could be switched in; nothing was imported: run it again"
            )
        return int(version)

    async def abandon(self) -> None:
        """Delete whatever the staging area holds (nothing if the switch took it). Best
        effort: what cannot be deleted now expires by itself."""
        try:
            doomed = [key async for key in self._redis.scan_iter(match=f"{self._staged_prefix}*")]
            for start in range(0, len(doomed), 1000):
                await self._redis.unlink(*doomed[start : start + 1000])
        except Exception:  # Redis unreachable: the TTL cleans up
            pass


def _parts(items: tuple, size: int):
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _changed(expected: int | None, version: int) -> str:
    return (
        f"the registry changed while the import was planned or written (version "
        f"{expected} -> {version}); nothing was imported: run it again"
    )
