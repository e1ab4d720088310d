-- tollgate: inflight, renew this instance's lease and repair its count from the local truth.
--
-- KEYS[1]  counts: hash {instance = units it holds}
-- KEYS[2]  leases: sorted set {instance = end of its lease, µs}
-- ARGV     instance, count, lease (µs), dirty (0|1)
--
-- The instance's own count is authoritative. Dirty (Redis may disagree: units the fallback
-- admitted, a release that was lost): it overwrites what Redis holds for the instance.
-- Clean: Redis's count stays, since it may include an acquire or a release still on its
-- way back to the instance, unless Redis lost it (a restart, an expired lease). A count of
-- 0 removes the instance. Drops instances whose lease ended and extends both keys to the
-- latest lease. Time is Redis TIME in µs. Returns the fleet total after the renewal.

local me = ARGV[1]
local count = tonumber(ARGV[2])
local lease = tonumber(ARGV[3])
local dirty = ARGV[4] ~= '0'
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])

local function str(x)
  return string.format('%.0f', x)
end

local dead = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', str(now))
if #dead > 0 then
  redis.call('HDEL', KEYS[1], unpack(dead))
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', str(now))
end

if count > 0 then
  if dirty then
    redis.call('HSET', KEYS[1], me, str(count))
  else
    redis.call('HSETNX', KEYS[1], me, str(count))
  end
  redis.call('ZADD', KEYS[2], str(now + lease), me)
elseif dirty then
  redis.call('HDEL', KEYS[1], me)
  redis.call('ZREM', KEYS[2], me)
end

local total = 0
local counts = redis.call('HVALS', KEYS[1])
for i = 1, #counts do
  total = total + tonumber(counts[i])
end
if total == 0 then
  redis.call('DEL', KEYS[1], KEYS[2])
  return 0
end
local last = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
if last[2] then
  local ttl = math.ceil((tonumber(last[2]) - now) / 1000) + 1
  redis.call('PEXPIRE', KEYS[1], str(ttl))
  redis.call('PEXPIRE', KEYS[2], str(ttl))
end
return total
