-- tollgate: concurrency, renew a holder's lease on several counters, repairing its copies
-- there from the holder's own (authoritative) counts.
--
-- KEYS     pairs, one per counter: counts_i (hash {field = copies}), leases_i (sorted set
--          {field = lease end, µs}); see counters_acquire.lua
-- ARGV     field, lease (µs), count_1, dirty_1, ..., count_N, dirty_N
--
-- A dirty counter (Redis may disagree: copies the fallback admitted, a release that was
-- lost) gets the holder's count written over Redis's; a clean one keeps Redis's count,
-- which may already include an acquire or a release on its way back to the holder, and
-- gets the holder's count only if Redis lost it (a restart, an expired lease). A count of 0
-- removes the holder. Holders whose lease ended are dropped, and the keys are extended to
-- the latest lease. Time is Redis TIME in µs. Returns the counters' totals after.

local me = ARGV[1]
local lease = tonumber(ARGV[2])
local now = clock()

local totals = {}
for i = 1, #KEYS / 2 do
  local counts, leases = KEYS[2 * i - 1], KEYS[2 * i]
  local count = tonumber(ARGV[1 + 2 * i])
  local dirty = ARGV[2 + 2 * i] == '1'
  drop_ended(counts, leases, now)
  if count > 0 then
    if dirty then
      redis.call('HSET', counts, me, str(count))
    else
      redis.call('HSETNX', counts, me, str(count))
    end
    redis.call('ZADD', leases, str(now + lease), me)
  elseif dirty then
    redis.call('HDEL', counts, me)
    redis.call('ZREM', leases, me)
  end
  if count == 0 and not dirty and redis.call('HEXISTS', counts, me) == 1 then
    -- Not ours to change, but a count of ours stays leased.
    redis.call('ZADD', leases, str(now + lease), me)
  end
  local total = held_total(counts)
  if total == 0 then
    redis.call('DEL', counts, leases)
  else
    expire_with_leases(counts, leases, now)
  end
  totals[i] = total
end
return totals
