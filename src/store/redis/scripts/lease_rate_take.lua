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

local max = tonumber(ARGV[1])
local per = tonumber(ARGV[2])
local tick = tonumber(ARGV[3])
local want = tonumber(ARGV[4])
local now, replay = clock(ARGV[5])

local t = fdiv(now, tick)
local period = fdiv(t, per)
local e = t - period * per
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
    -- Ahead of this clock (see rate.lua): count at the start of the stored period.
    period, e, curr, prev = sp, 0, sc, sq
  end
end
local at = period * per + e

-- floor(max - estimate) for the count c, at least 0 (rate.lua's room_for).
local function room_for(c)
  if c > max then
    return 0
  end
  local room = (max - c) * per
  if prev == 0 then
    return max - c
  elseif per - e <= fdiv(room, prev) then
    return fdiv(room - prev * (per - e), per)
  end
  return 0
end

local granted = math.min(want, room_for(curr))
curr = curr + granted
local remaining = room_for(curr)
-- µs from now until the period ends (from `at`, which a clock behind the stored period
-- moved forward: then the slice is valid until the stored period's end).
local valid = math.max((at + per - e) * tick - now, 0)

if curr == 0 and prev == 0 then
  redis.call('DEL', KEYS[1])
else
  redis.call('HSET', KEYS[1], 'p', str(period), 'c', str(curr), 'q', str(prev))
  local ends = period + 1
  if curr > 0 then
    ends = period + 2
  end
  expire_in(KEYS[1], cdiv(math.max(ends * per * tick - now, 1), 1000), replay)
end

return {granted, remaining, period, valid}
