-- tollgate: sliding-window rate, acquire (one atomic decision), exact per key.
--
-- KEYS[1]  the window: hash {p = current period, c = its count, q = the previous period's}
-- ARGV     max, per (ticks), tick (µs), cost, strict (0|1), min, [at]
--
-- Time is read in microseconds (Redis TIME, or `at` for a replay) and counted in ticks of
-- `tick` µs (1, 10, 100 or 1000: the caller picks the smallest with per <= 2^27 ticks).
-- Period p covers ticks [p*per, (p+1)*per); e ticks of it have elapsed. The estimate is
-- prev * (1 - e/per) + curr, and a request is admitted iff estimate + cost <= max, i.e.
--
--     prev * (per - e) <= (max - curr - cost) * per
--
-- decided with integers only. Why they stay exact in doubles (integers below 2^53): the
-- caller bounds max <= 2^25 and per <= 2^27 ticks, so the right side is at most 2^52; the
-- left side is never multiplied out: since per - e is an integer, the test is
-- per - e <= floor(right / prev), an exact floor division of two integers below 2^52
-- (fdiv). Counts saturate at 2^52. remaining multiplies prev * (per - e) only once it is
-- known to be <= (max - curr) * per <= 2^52. Rejected requests do not count unless strict.
-- retry_after is exact to the tick: admitted at now + retry_after, rejected a tick before.
--
-- A request asks for between `min` and `cost` events (min <= cost; a fixed cost passes
-- min = cost): admitted iff `min` fits, and then the largest count g <= cost that fits is
-- counted. g fits iff g <= room = floor(((max - curr) * per - prev * (per - e)) / per), the
-- `remaining` before the request, so g = min(cost, room). A rejection counts `min` when
-- strict (the least that was asked for), and its retry_after is the time until `min` fits.
--
-- The key expires when the estimate reaches 0 (the end of the next period if curr > 0,
-- of this one if only prev > 0); an empty window is deleted.
--
-- Returns {allowed (0|1), remaining, reset_after µs, retry_after µs, granted}.

local max, per, tick, cost, strict, min, now, replay = request_args()

local period, e, prev, curr = window_load(KEYS[1], now, tick, per)
-- The tick the answer is relative to (later than now's when the stored period was ahead).
local at = period * per + e

local function fits(c, k)
  if c + k > max then
    return false
  end
  if prev == 0 then
    return true
  end
  return per - e <= fdiv((max - c - k) * per, prev)
end

local allowed = 0
local granted = 0
if fits(curr, min) then
  granted = math.min(cost, window_room(curr, max, per, e, prev))
  curr = curr + granted
  allowed = 1
elseif strict then
  curr = math.min(curr + min, CAP)
end

-- floor(max - estimate), at least 0.
local remaining = window_room(curr, max, per, e, prev)

-- A duration of d ticks from `at`, in µs from now.
local function micros(d)
  return (at + d) * tick - now
end

local reset = 0
if curr > 0 then
  reset = micros(per - e + per)
elseif prev > 0 then
  reset = micros(per - e)
end

local retry = 0
if allowed == 0 then
  if min > max then
    -- It can never pass; one window is a hint.
    retry = per * tick
  else
    local wait
    if curr + min <= max then
      local budget = (max - curr - min) * per
      local q = math.min(fdiv(budget, math.max(prev, 1)), per)
      wait = math.max(per - q - e, 0)
    else
      -- curr > max - min >= 0, so floor(budget / curr) < per.
      local budget = (max - min) * per
      wait = (per - e) + (per - fdiv(budget, curr))
    end
    retry = micros(math.max(wait, 1))
  end
end

window_put(KEYS[1], period, prev, curr, per, tick, now, replay)

return {allowed, remaining, reset, retry, granted}
