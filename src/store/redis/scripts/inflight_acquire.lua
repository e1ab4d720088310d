-- tollgate: inflight, acquire one unit for this instance if the fleet total allows it.
--
-- KEYS[1]  counts: hash {instance = units it holds}
-- KEYS[2]  leases: sorted set {instance = end of its lease, µs}
-- ARGV     instance, max, lease (µs)
--
-- Each instance's units live only as long as its lease, which the instance renews (every
-- lease/3, see inflight_renew.lua); an instance that dies stops renewing and its share is
-- dropped by the first script that runs after its lease ended. Time is Redis TIME in µs.
-- The unit is taken iff total + 1 <= max. Both keys expire with the latest lease.
--
-- Returns {admitted (0|1), total after the increment (the estimate that was compared)}.

local me = ARGV[1]
local max = tonumber(ARGV[2])
local lease = tonumber(ARGV[3])
local now = clock()

drop_ended(KEYS[1], KEYS[2], now)
local total = held_total(KEYS[1])
if total + 1 > max then
  return {0, total + 1}
end

redis.call('HINCRBY', KEYS[1], me, 1)
redis.call('ZADD', KEYS[2], str(now + lease), me)
expire_with_leases(KEYS[1], KEYS[2], now)
return {1, total + 1}
