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
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])

local function str(x)
  return string.format('%.0f', x)
end

local totals = {}
for i = 1, #KEYS / 2 do
  local counts, leases = KEYS[2 * i - 1], KEYS[2 * i]
  local count = tonumber(ARGV[1 + 2 * i])
  local dirty = ARGV[2 + 2 * i] == '1'
  local dead = redis.call('ZRANGEBYSCORE', leases, '-inf', str(now))
  if #dead > 0 then
    redis.call('HDEL', counts, unpack(dead))
    redis.call('ZREMRANGEBYSCORE', leases, '-inf', str(now))
  end
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
  local total = 0
  if count == 0 and not dirty and redis.call('HEXISTS', counts, me) == 1 then
    -- Not ours to change, but a count of ours stays leased.
    redis.call('ZADD', leases, str(now + lease), me)
  end
  local held = redis.call('HVALS', counts)
  for j = 1, #held do
    total = total + tonumber(held[j])
  end
  if total == 0 then
    redis.call('DEL', counts, leases)
  else
    local last = redis.call('ZRANGE', leases, -1, -1, 'WITHSCORES')
    if last[2] then
      local ttl = math.ceil((tonumber(last[2]) - now) / 1000) + 1
      redis.call('PEXPIRE', counts, str(ttl))
      redis.call('PEXPIRE', leases, str(ttl))
    end
  end
  totals[i] = total
end
return totals
