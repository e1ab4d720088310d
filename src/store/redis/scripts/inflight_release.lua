-- tollgate: inflight, release one unit this instance holds (fire and forget, never below 0).
--
-- KEYS[1]  counts: hash {instance = units it holds}
-- KEYS[2]  leases: sorted set {instance = end of its lease, µs}
-- ARGV     instance
--
-- Returns the units the instance still holds.

local me = ARGV[1]
if redis.call('HEXISTS', KEYS[1], me) == 0 then
  return 0
end
local left = redis.call('HINCRBY', KEYS[1], me, -1)
if left <= 0 then
  redis.call('HDEL', KEYS[1], me)
  redis.call('ZREM', KEYS[2], me)
  if redis.call('HLEN', KEYS[1]) == 0 then
    redis.call('DEL', KEYS[1], KEYS[2])
  end
  return 0
end
return left
