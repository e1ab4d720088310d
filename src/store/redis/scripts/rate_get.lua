-- tollgate: sliding-window rate, read only: the window's counts now, counting nothing.
--
-- KEYS[1]  the window: hash {p = current period, c = its count, q = the previous period's}
-- ARGV     per (ticks), tick (µs)
--
-- Time is Redis TIME in µs, counted in ticks as rate.lua counts it: period p covers ticks
-- [p*per, (p+1)*per), e ticks of it have elapsed, and the estimate is
-- prev * (per - e) / per + curr. A stored period ahead of this clock is read at its start
-- (e = 0), as rate.lua decides it. Returns {prev, curr, e}. Writes nothing.

local per = tonumber(ARGV[1])
local tick = tonumber(ARGV[2])
local now = clock()

local ticks = fdiv(now, tick)
local period = fdiv(ticks, per)
local e = ticks - period * per
local prev, curr = 0, 0
local state = redis.call('HMGET', KEYS[1], 'p', 'c', 'q')
if state[1] then
  local sp = tonumber(state[1])
  local sc = tonumber(state[2]) or 0
  local sq = tonumber(state[3]) or 0
  if sp == period then
    curr, prev = sc, sq
  elseif sp == period - 1 then
    prev = sc
  elseif sp > period then
    e, curr, prev = 0, sc, sq
  end
end
return {prev, curr, e}
