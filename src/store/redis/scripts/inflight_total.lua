-- tollgate: inflight, read only: the fleet's units in flight, counting only instances
-- whose lease has not ended.
--
-- KEYS[1]  counts: hash {instance = units it holds}
-- KEYS[2]  leases: sorted set {instance = end of its lease, µs}
--
-- Returns the total. Writes nothing.

local now = clock()
local live = redis.call('ZRANGEBYSCORE', KEYS[2], '(' .. str(now), '+inf')
local total = 0
for i = 1, #live do
  total = total + (tonumber(redis.call('HGET', KEYS[1], live[i])) or 0)
end
return total
