-- tollgate: sliding-window rate, refund: takes back an admitted event (a later limit
-- rejected the request), from the current period first, then the previous one, never
-- below zero (the in-process limiter's rule).
--
-- KEYS[1]  the window: hash {p = current period, c = its count, q = the previous period's}
-- ARGV     per (ticks), tick (µs), cost, [at]
--
-- Units as in rate.lua. Returns the current period's count after the refund.

local per, tick, cost = numbers(1, 3)
local now = clock(ARGV[4])

-- An absent window is empty: nothing comes off it.
local period, _, prev, curr = window_load(KEYS[1], now, tick, per)

local take = math.min(cost, curr)
curr = curr - take
prev = prev - math.min(cost - take, prev)

-- The expiry the last acquire set still holds: a refund only lowers the counts.
window_put(KEYS[1], period, prev, curr)
return curr
