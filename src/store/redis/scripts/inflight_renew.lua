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
local now = clock()

drop_ended(KEYS[1], KEYS[2], now)

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

local total = held_total(KEYS[1])
if total == 0 then
  redis.call('DEL', KEYS[1], KEYS[2])
  return 0
end
expire_with_leases(KEYS[1], KEYS[2], now)
return total
