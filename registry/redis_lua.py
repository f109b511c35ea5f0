"""The Redis store's Lua scripts: each quota check-and-count is one atomic step on Redis."""

# Sliding one-minute windows kept as one counter per unix second (hash field); a window
# hash untouched for 120 s expires.
WINDOW_LUA = """
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
RESERVED_LUA = """
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
ACQUIRE_LUA = (
    WINDOW_LUA
    + RESERVED_LUA
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
RELEASE_LUA = (
    WINDOW_LUA
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
ADD_TOKENS_LUA = (
    WINDOW_LUA
    + """
window(KEYS[1])
redis.call('HINCRBY', KEYS[1], math.floor(now), ARGV[2])
redis.call('EXPIRE', KEYS[1], 120)
return 1
"""
)

# KEYS: lora-int-id. ARGV: seed for a missing counter.
NEW_ID_LUA = """
if redis.call('EXISTS', KEYS[1]) == 0 then redis.call('SET', KEYS[1], ARGV[1]) end
return redis.call('INCR', KEYS[1])
"""

# KEYS: leases, reserved. ARGV: now, lease, new expiry, lease key TTL in ms.
REFRESH_LUA = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
if not redis.call('ZSCORE', KEYS[1], ARGV[2]) then return 0 end
redis.call('ZADD', KEYS[1], ARGV[3], ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
redis.call('PEXPIRE', KEYS[2], ARGV[4])
return 1
"""
