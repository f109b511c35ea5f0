"""The Redis store's adapter indexes (see `loragate.registry.adapter_index` for why).

Keys, under `<namespace>:`:
  adapter-index         zset  every adapter key, score 0 (ZRANGEBYLEX pages it in key order)
  owned:<tenant>        zset  the tenant's adapter names, score 0
  adapter-totals:<tenant> hash  `adapters` and `size_bytes` of the tenant's adapters
  public-names          hash  public name -> the key of the adapter that has it
  public-index          zset  the public names, score 0
  object-refs           hash  adapter store object -> how many records reference it
  changes               zset  the change log: version -> {"version","kind","name"} JSON

`queue_put` and `queue_remove` queue a record's write together with its indexes inside the
caller's MULTI (`queue_put_many`: a restore's batch of them in a few commands);
`ANNOUNCE_LUA` bumps the version, logs the change and publishes it, in the same MULTI.
Each read below is one command (a script where it needs two lookups), so a
name, a public name, a tenant's counters, a page and the changes since a version each take
one round trip whatever the registry holds.

Lua compares strings with strcoll, which follows Redis's locale: the scripts compare names
byte by byte instead, the order ZRANGEBYLEX and Python's sort both use for these names.
"""

from __future__ import annotations

import msgspec

from loragate.registry.records import AdapterMetadata

_PAGE_RANGE = """
local function range_after(key, cursor, count)
  local lo = cursor == '' and '-' or '(' .. cursor
  return redis.call('ZRANGEBYLEX', key, lo, '+', 'LIMIT', 0, count)
end
"""

# KEYS: adapter-index, adapters. ARGV: after ('' from the start), limit.
# Returns {has_more, {record JSON...}}.
PAGE_LUA = (
    _PAGE_RANGE
    + """
local limit = tonumber(ARGV[2])
local keys = range_after(KEYS[1], ARGV[1], limit + 1)
local more = 0
if #keys > limit then more = 1; table.remove(keys) end
if #keys == 0 then return {more, {}} end
return {more, redis.call('HMGET', KEYS[2], unpack(keys))}
"""
)

# KEYS: owned:<tenant>, public-index, public-names, adapters. ARGV: after, limit, tenant.
# Own names and public names merged in byte order; a public name the tenant owns is its own.
VISIBLE_PAGE_LUA = (
    _PAGE_RANGE
    + """
local limit = tonumber(ARGV[2])
local function stream(key)
  local buf, i, cursor, done = {}, 1, ARGV[1], false
  return function()
    if i > #buf then
      if done then return nil end
      buf, i = range_after(key, cursor, limit + 1), 1
      done = #buf < limit + 1
      if #buf == 0 then return nil end
      cursor = buf[#buf]
    end
    i = i + 1
    return buf[i - 1]
  end
end
local function before_or_same(a, b)
  for k = 1, math.min(#a, #b) do
    local x, y = string.byte(a, k), string.byte(b, k)
    if x ~= y then return x < y end
  end
  return #a <= #b
end
local own, public = stream(KEYS[1]), stream(KEYS[2])
local mine, shared = own(), public()
local fields, more = {}, 0
while mine or shared do
  local field
  if (not shared) or (mine and before_or_same(mine, shared)) then
    if shared == mine then shared = public() end
    field, mine = ARGV[3] .. '/' .. mine, own()
  else
    field, shared = redis.call('HGET', KEYS[3], shared), public()
  end
  if #fields == limit then more = 1; break end
  fields[#fields + 1] = field
end
if #fields == 0 then return {more, {}} end
return {more, redis.call('HMGET', KEYS[4], unpack(fields))}
"""
)

# KEYS: public-names, adapters. ARGV: name. The public adapter's record, or nil.
PUBLIC_LUA = """
local key = redis.call('HGET', KEYS[1], ARGV[1])
if not key then return false end
return redis.call('HGET', KEYS[2], key)
"""

# announce(version, changes, events, kind, name, log size): bump the version, log the
# change, publish it; returns the new version.
ANNOUNCE_FUNCTION = """
local function announce(version_key, changes_key, events_key, kind, name, log_size)
  local version = redis.call('INCR', version_key)
  local entry = cjson.encode({version = version, kind = kind, name = name})
  redis.call('ZADD', changes_key, version, entry)
  local size = tonumber(log_size)
  if redis.call('ZCARD', changes_key) > size then
    redis.call('ZREMRANGEBYRANK', changes_key, 0, -size - 1)
  end
  redis.call('PUBLISH', events_key, cjson.encode({kind = kind, name = name}))
  return version
end
"""

# KEYS: version, changes, events. ARGV: kind, name, log size. Returns the new version.
ANNOUNCE_LUA = (
    ANNOUNCE_FUNCTION
    + """
return announce(KEYS[1], KEYS[2], KEYS[3], ARGV[1], ARGV[2], ARGV[3])
"""
)

# KEYS: version, changes. ARGV: since, limit. Returns {latest, complete, {entry JSON...}}:
# complete only if the log holds every version after `since`.
CHANGES_LUA = """
local latest = tonumber(redis.call('GET', KEYS[1]) or '0')
local since = tonumber(ARGV[1])
if since >= latest then
  if since == latest then return {latest, 1, {}} end
  return {latest, 0, {}}
end
if redis.call('ZCOUNT', KEYS[2], '(' .. since, latest) ~= latest - since then
  return {latest, 0, {}}
end
local entries = redis.call('ZRANGEBYSCORE', KEYS[2], '(' .. since, latest, 'LIMIT', 0, ARGV[2])
return {latest, 1, entries}
"""


def queue_put(pipe, keys, old: AdapterMetadata | None, new: AdapterMetadata) -> None:
    """Queue `new` under its key (replacing `old`, what the key held) with its indexes."""
    pipe.hset(keys.adapters, new.key, msgspec.json.encode(new))
    pipe.zadd(keys.adapter_index, {new.key: 0})
    if new.tenant is not None:
        pipe.zadd(keys.owned(new.tenant), {new.name: 0})
        totals = keys.adapter_totals(new.tenant)
        if old is None:
            pipe.hincrby(totals, "adapters", 1)
        pipe.hincrby(totals, "size_bytes", new.size_bytes - (old.size_bytes if old else 0))
    if old is not None and old.public and not new.public:
        _unpublish(pipe, keys, old)
    if new.public:
        pipe.hset(keys.public_names, new.name, new.key)
        pipe.zadd(keys.public_index, {new.name: 0})
    before = old.store_object if old is not None else None
    if before != new.store_object:
        if before is not None:
            pipe.hincrby(keys.object_refs, before, -1)
        if new.store_object is not None:
            pipe.hincrby(keys.object_refs, new.store_object, 1)


def queue_put_many(
    pipe, keys, pairs: list[tuple[AdapterMetadata | None, AdapterMetadata]]
) -> list[str]:
    """What `queue_put` queues for each (old, new) pair (in order; a key may appear twice),
    in a few commands for the whole batch: each record, index and counter key written once.
    Returns the keys it writes."""
    records, index, owned, public_names, public_index = {}, {}, {}, {}, {}
    unpublished: set[str] = set()
    totals: dict[str, dict[str, int]] = {}
    refs: dict[str, int] = {}
    for old, new in pairs:
        records[new.key] = msgspec.json.encode(new)
        index[new.key] = 0
        if new.tenant is not None:
            owned.setdefault(new.tenant, {})[new.name] = 0
            counts = totals.setdefault(new.tenant, {"adapters": 0, "size_bytes": 0})
            counts["adapters"] += old is None
            counts["size_bytes"] += new.size_bytes - (old.size_bytes if old else 0)
        if old is not None and old.public and not new.public:
            public_names.pop(old.name, None)
            public_index.pop(old.name, None)
            unpublished.add(old.name)
        if new.public:
            public_names[new.name] = new.key
            public_index[new.name] = 0
            unpublished.discard(new.name)
        before = old.store_object if old is not None else None
        if before != new.store_object:
            if before is not None:
                refs[before] = refs.get(before, 0) - 1
            if new.store_object is not None:
                refs[new.store_object] = refs.get(new.store_object, 0) + 1
    written = []
    if records:
        pipe.hset(keys.adapters, mapping=records)
        pipe.zadd(keys.adapter_index, index)
        written += [keys.adapters, keys.adapter_index]
    for tenant, names in owned.items():
        pipe.zadd(keys.owned(tenant), names)
        written.append(keys.owned(tenant))
    for tenant, counts in totals.items():
        for field, amount in counts.items():
            pipe.hincrby(keys.adapter_totals(tenant), field, amount)
        written.append(keys.adapter_totals(tenant))
    if unpublished:
        pipe.hdel(keys.public_names, *unpublished)
        pipe.zrem(keys.public_index, *unpublished)
    if public_names:
        pipe.hset(keys.public_names, mapping=public_names)
        pipe.zadd(keys.public_index, public_index)
    if unpublished or public_names:
        written += [keys.public_names, keys.public_index]
    changed = {oid: delta for oid, delta in refs.items() if delta}
    for oid, delta in changed.items():
        pipe.hincrby(keys.object_refs, oid, delta)
    if changed:
        written.append(keys.object_refs)
    return written


def queue_remove(pipe, keys, old: AdapterMetadata) -> None:
    """Queue the removal of `old` (what its key holds) and of its indexes."""
    pipe.hdel(keys.adapters, old.key)
    pipe.zrem(keys.adapter_index, old.key)
    if old.tenant is not None:
        pipe.zrem(keys.owned(old.tenant), old.name)
        totals = keys.adapter_totals(old.tenant)
        pipe.hincrby(totals, "adapters", -1)
        pipe.hincrby(totals, "size_bytes", -old.size_bytes)
    if old.public:
        _unpublish(pipe, keys, old)
    if old.store_object is not None:
        pipe.hincrby(keys.object_refs, old.store_object, -1)


def _unpublish(pipe, keys, old: AdapterMetadata) -> None:
    # The store keeps public names unique, so the name is `old`'s own.
    pipe.hdel(keys.public_names, old.name)
    pipe.zrem(keys.public_index, old.name)
