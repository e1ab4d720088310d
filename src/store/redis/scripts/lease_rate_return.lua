-- tollgate: sliding-window rate, lease return: counts a slice took and did not spend go
-- back, if their period is still counted.
--
-- KEYS[1]  the window: hash {p = current period, c = its count, q = the previous period's}
-- ARGV     per (ticks), tick (µs), n, epoch (the period the counts were taken in), [at]
--
-- Units as in rate.lua. Counts taken in the current period come off its count; counts of
-- the previous period come off the previous count (they weigh on the estimate until the
-- period after, and were never spent); older ones are gone already. Never below zero.
-- Returns the current period's count after.

local per = tonumber(ARGV[1])
local tick = tonumber(ARGV[2])
local n = tonumber(ARGV[3])
local epoch = tonumber(ARGV[4])
local now = clock(ARGV[5])

local state = redis.call('HMGET', KEYS[1], 'p', 'c', 'q')
if not state[1] then
  return 0
end
local period = fdiv(fdiv(now, tick), per)
local sp = tonumber(state[1])
local sc = tonumber(state[2]) or 0
local sq = tonumber(state[3]) or 0
local prev, curr = 0, 0
if sp == period then
  curr, prev = sc, sq
elseif sp == period - 1 then
  prev = sc
elseif sp > period then
  period, curr, prev = sp, sc, sq
end

if epoch == period then
  curr = curr - math.min(n, curr)
elseif epoch == period - 1 then
  prev = prev - math.min(n, prev)
else
  return curr
end

if curr == 0 and prev == 0 then
  redis.call('DEL', KEYS[1])
else
  -- HSET keeps the expiry the last take set, which still holds: a return only lowers
  -- the counts.
  redis.call('HSET', KEYS[1], 'p', str(period), 'c', str(curr), 'q', str(prev))
end
return curr
