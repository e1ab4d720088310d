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

local _, e, prev, curr = window_load(KEYS[1], now, tick, per)
return {prev, curr, e}
