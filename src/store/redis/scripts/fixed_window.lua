-- tollgate: fixed-window rate, acquire (one atomic decision), exact per key; the window
-- envoyproxy/ratelimit counts in (`rls.window: fixed`).
--
-- KEYS[1]  the window: hash {p = current period, c = its count} (rate.lua's layout, whose
--          `q` this script writes as 0: rate_refund.lua and rate_get.lua read it alike)
-- ARGV     max, per (ticks), tick (µs), cost, strict (0|1), min, [at]
--
-- Time is read in microseconds (Redis TIME, or `at` for a replay) and counted in ticks of
-- `tick` µs, as rate.lua does. Period p covers ticks [p*per, (p+1)*per), aligned to
-- multiples of the window (a minute's starts at :00 on Redis's clock); e ticks of it have
-- elapsed. Only the current period counts: a request asking for between `min` and `cost`
-- events is admitted iff curr + min <= max, and then g = min(cost, max - curr) are counted.
-- A rejection counts `min` when strict. All integers stay below 2^52 (the caller bounds
-- max <= 2^25; counts saturate at CAP).
--
-- reset_after is the time to the period's end while it counts anything (counts reset
-- there), and a rejection's retry_after is that same boundary: the next period admits
-- up to max (min > max never fits: one window is a hint, as rate.lua answers).
--
-- The key expires at the period's end; an empty window is deleted.
--
-- Returns {allowed (0|1), remaining, reset_after µs, retry_after µs, granted}.

local max, per, tick, cost, strict, min, now, replay = request_args()

-- rate.lua's window, whose previous period a fixed window does not count.
local period, e, _, curr = window_load(KEYS[1], now, tick, per)
-- The tick the answer is relative to (later than now's when the stored period was ahead).
local at = period * per + e

-- A duration of d ticks from `at`, in µs from now.
local function micros(d)
  return (at + d) * tick - now
end

local allowed = 0
local granted = 0
if curr + min <= max then
  granted = math.min(cost, max - curr)
  curr = curr + granted
  allowed = 1
elseif strict then
  curr = math.min(curr + min, CAP)
end

local remaining = math.max(max - curr, 0)

local reset = 0
if curr > 0 then
  reset = micros(per - e)
end

-- A rejection retries at the boundary (min > max: after one window, a hint).
local retry = 0
if allowed == 0 then
  retry = min > max and per * tick or micros(math.max(per - e, 1))
end

if curr == 0 then
  redis.call('DEL', KEYS[1])
else
  redis.call('HSET', KEYS[1], 'p', str(period), 'c', str(curr), 'q', '0')
  expire_in(KEYS[1], cdiv(math.max((period + 1) * per * tick - now, 1), 1000), replay)
end

return {allowed, remaining, reset, retry, granted}
