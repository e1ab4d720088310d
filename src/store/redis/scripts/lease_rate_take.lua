-- tollgate: sliding-window rate, lease take: a slice of counts in the current period for
-- an instance to spend locally (a hot key's lease).
--
-- KEYS[1]  the window: hash {p = current period, c = its count, q = the previous period's}
-- ARGV     max, per (ticks), tick (µs), want, [at]
--
-- Units, periods and the estimate as in rate.lua. The slice is the largest count up to
-- `want` that fits now, g = min(want, room), room = floor(max - estimate), counted in the
-- current period at once. Spending it later in the same period is never over the limit:
-- the estimate only falls as the period goes on (the previous period's weight shrinks),
-- and every count spent was in the estimate when it was taken. Spent in the next period
-- it would be: the slice is valid only until the period ends, and the caller voids what
-- is left then (the epoch changes). g may be 0: the caller then decides exactly.
--
-- Returns {granted, remaining (room after), epoch (the period), valid µs (until its end)}.

local max, per, tick, want = numbers(1, 4)
local now, replay = clock(ARGV[5])

local period, e, prev, curr = window_load(KEYS[1], now, tick, per)
local at = period * per + e

local granted = math.min(want, window_room(curr, max, per, e, prev))
curr = curr + granted
local remaining = window_room(curr, max, per, e, prev)
-- µs from now until the period ends (from `at`, which a clock behind the stored period
-- moved forward: then the slice is valid until the stored period's end).
local valid = math.max((at + per - e) * tick - now, 0)

window_put(KEYS[1], period, prev, curr, per, tick, now, replay)

return {granted, remaining, period, valid}
