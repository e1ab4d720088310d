-- tollgate: sliding-window rate, refund: takes back an admitted event (a later limit
-- rejected the request), from the current period first, then the previous one, never
-- below zero (the in-process limiter's rule).
--
-- KEYS[1]  the window: hash {p = current period, c = its count, q = the previous period's}
-- ARGV     per (ticks), tick (µs), cost, [at]
--
-- Units as in rate.lua. Returns the current period's count after the refund.

local per = tonumber(ARGV[1])
local tick = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local now, replay = clock(ARGV[4])

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

local take = math.min(cost, curr)
curr = curr - take
prev = prev - math.min(cost - take, prev)

if curr == 0 and prev == 0 then
  redis.call('DEL', KEYS[1])
else
  -- HSET keeps the expiry the last acquire set, which still holds: a refund only lowers
  -- the counts.
  redis.call('HSET', KEYS[1], 'p', str(period), 'c', str(curr), 'q', str(prev))
end
return curr
