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

local total = 0
local counts = redis.call('HVALS', KEYS[1])
for i = 1, #counts do
  total = total + tonumber(counts[i])
end
if total + 1 > max then
  return {0, total + 1}
end

redis.call('HINCRBY', KEYS[1], me, 1)
redis.call('ZADD', KEYS[2], str(now + lease), me)
local last = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
local ttl = math.ceil((tonumber(last[2]) - now) / 1000) + 1
redis.call('PEXPIRE', KEYS[1], str(ttl))
redis.call('PEXPIRE', KEYS[2], str(ttl))
return {1, total + 1}
