"""Brings data written by older versions to today's layout, once, when a store opens.

Two steps, in one Lua script (atomic), run only when the adapter index does not hold as
many keys as the `adapters` hash (data written before the indexes existed, or before
per-tenant namespaces); otherwise the script reads two counters and returns:
- Before per-tenant namespaces, the `adapters` hash was keyed by the bare name for every
  owner (names were global). Now a tenant's adapter lives under `<tenant>/<name>`. Old
  names were unique, so moving each tenant-owned record to its tenant's key can never
  collide; the operator's keep their key.
- The indexes (`loragate.registry.redis_index`) are built from the records.
Every replica of a deployment must run this version: an older replica would write records
without their indexes (they would be rebuilt at the next start of a newer one).
"""

from __future__ import annotations

# KEYS: adapters, adapter-index, public-names, public-index, object-refs, tenants, version.
# ARGV: namespace. Returns how many records it indexed (0: nothing to do).
_UPGRADE_LUA = """
if redis.call('HLEN', KEYS[1]) == redis.call('ZCARD', KEYS[2]) then return 0 end
local ns = ARGV[1]
local flat = redis.call('HGETALL', KEYS[1])
for i = 1, #flat, 2 do
  local key, raw = flat[i], flat[i + 1]
  if not string.find(key, '/', 1, true) then
    local tenant = cjson.decode(raw)['tenant']
    if type(tenant) == 'string' then
      redis.call('HSET', KEYS[1], tenant .. '/' .. key, raw)
      redis.call('HDEL', KEYS[1], key)
    end
  end
end
for _, tenant in ipairs(redis.call('HKEYS', KEYS[6])) do
  redis.call('DEL', ns .. ':owned:' .. tenant, ns .. ':adapter-totals:' .. tenant)
end
redis.call('DEL', KEYS[2], KEYS[3], KEYS[4], KEYS[5])
local seen = {}
flat = redis.call('HGETALL', KEYS[1])
for i = 1, #flat, 2 do
  local key, record = flat[i], cjson.decode(flat[i + 1])
  redis.call('ZADD', KEYS[2], 0, key)
  if type(record['tenant']) == 'string' then
    local tenant = record['tenant']
    if not seen[tenant] then
      seen[tenant] = true
      redis.call('DEL', ns .. ':owned:' .. tenant, ns .. ':adapter-totals:' .. tenant)
    end
    redis.call('ZADD', ns .. ':owned:' .. tenant, 0, record['name'])
    local totals = ns .. ':adapter-totals:' .. tenant
    redis.call('HINCRBY', totals, 'adapters', 1)
    redis.call('HINCRBY', totals, 'size_bytes', record['size_bytes'])
  end
  if record['public'] == true then
    local holder = redis.call('HGET', KEYS[3], record['name'])
    if not holder or key == record['name'] then
      redis.call('HSET', KEYS[3], record['name'], key)
      redis.call('ZADD', KEYS[4], 0, record['name'])
    end
  end
  if type(record['store_object']) == 'string' then
    redis.call('HINCRBY', KEYS[5], record['store_object'], 1)
  end
end
redis.call('INCR', KEYS[7])
return #flat / 2
"""


async def upgrade_layout(redis, keys, namespace: str) -> int:
    """The number of records indexed (0 when the data is already in today's layout)."""
    names = [
        keys.adapters,
        keys.adapter_index,
        keys.public_names,
        keys.public_index,
        keys.object_refs,
        keys.tenants,
        keys.version,
    ]
    return int(await redis.eval(_UPGRADE_LUA, len(names), *names, namespace))
