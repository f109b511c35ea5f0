"""Moves adapters stored before per-tenant namespaces to the keys they have now.

Before, the `adapters` hash was keyed by the bare name for every owner (names were global).
Now a tenant's adapter lives under `<tenant>/<name>`. Old names were unique, so moving each
tenant-owned record to its tenant's key can never collide; the operator's keep their key.
It runs in one Lua script (atomic) each time a store opens, and moves nothing once done.
Every replica of a deployment must run this version: an older replica would keep writing
tenant adapters under bare names (they would be moved again at the next start).
"""

from __future__ import annotations

# KEYS: adapters, version. Returns how many records moved.
_MOVE_LUA = """
local flat = redis.call('HGETALL', KEYS[1])
local moved = 0
for i = 1, #flat, 2 do
  local key, raw = flat[i], flat[i + 1]
  if not string.find(key, '/', 1, true) then
    local tenant = cjson.decode(raw)['tenant']
    if type(tenant) == 'string' then
      redis.call('HSET', KEYS[1], tenant .. '/' .. key, raw)
      redis.call('HDEL', KEYS[1], key)
      moved = moved + 1
    end
  end
end
if moved > 0 then redis.call('INCR', KEYS[2]) end
return moved
"""


async def move_tenant_adapters_to_their_namespaces(redis, adapters_key: str, version_key: str):
    """The number of records moved (0 when the data is already in today's layout)."""
    return int(await redis.eval(_MOVE_LUA, 2, adapters_key, version_key))
