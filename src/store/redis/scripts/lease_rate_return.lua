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

local per, tick, n, epoch = numbers(1, 4)
local now = clock(ARGV[5])

-- An absent window is empty: nothing comes off it.
local period, _, prev, curr = window_load(KEYS[1], now, tick, per)

if epoch == period then
  curr = curr - math.min(n, curr)
elseif epoch == period - 1 then
  prev = prev - math.min(n, prev)
else
  return curr
end

-- The expiry the last take set still holds: a return only lowers the counts.
window_put(KEYS[1], period, prev, curr)
return curr
