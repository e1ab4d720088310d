-- tollgate: concurrency, give copies back to several counters (fire and forget, never
-- below zero).
--
-- KEYS     pairs, one per counter: counts_i (hash {field = copies}), leases_i (sorted set
--          {field = lease end, µs}); see counters_acquire.lua
-- ARGV     field, copies
--
-- A holder whose copies reach 0 leaves the counter; an empty counter is deleted. Returns
-- the copies the holder still holds in the first counter.

local me = ARGV[1]
local copies = tonumber(ARGV[2])
local first = 0
for i = 1, #KEYS / 2 do
  local counts, leases = KEYS[2 * i - 1], KEYS[2 * i]
  local left = 0
  if redis.call('HEXISTS', counts, me) == 1 then
    left = redis.call('HINCRBY', counts, me, -copies)
    if left <= 0 then
      left = 0
      redis.call('HDEL', counts, me)
      redis.call('ZREM', leases, me)
      if redis.call('HLEN', counts) == 0 then
        redis.call('DEL', counts, leases)
      end
    end
  end
  if i == 1 then
    first = left
  end
end
return first
