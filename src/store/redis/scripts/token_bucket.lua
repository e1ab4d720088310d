-- tollgate: token bucket, acquire (one atomic decision).
--
-- KEYS[1]  the bucket: hash {t = tokens, l = instant of the last refill}
-- ARGV     capacity, amount, every, cost, strict (0|1), min, [at]
--
-- Units: time in microseconds from Redis TIME (one clock for the fleet), or `at` when the
-- caller replays; counts in tokens. Every number stays an integer below 2^52, so Lua's
-- doubles are exact (the caller clamps the parameters; TIME in µs is below 2^52 until 2112).
--
-- Semantics (the same as the in-process limiter): n = floor((now - last) / every) refills
-- are due; tokens = min(capacity, tokens + n * amount), last += n * every, last = now once
-- full. A request asks for between `min` and `cost` tokens (min <= cost; a fixed cost
-- passes min = cost): admitted iff tokens >= min, then the largest count that fits,
-- g = min(tokens, cost), is taken; `strict` also sets last = now on a rejection, whose
-- retry_after is the time until `min` tokens are back. A `now` before the bucket's last
-- refill (a replay going back, another node's clock) is read as that instant: time never
-- goes backwards within a bucket. A full bucket equals an absent one: it is deleted, and
-- otherwise the key expires when it would be full again.
--
-- Returns {allowed (0|1), remaining tokens, reset_after µs, retry_after µs, granted}.

local capacity, amount, every, cost, strict, min, now, replay = request_args()

local tokens, last
tokens, last, now = bucket_load(KEYS[1], now, capacity, amount, every)

local allowed = 0
local granted = 0
if tokens >= min then
  granted = math.min(tokens, cost)
  tokens = tokens - granted
  allowed = 1
elseif strict then
  last = now
end

local retry = 0
if allowed == 0 then
  if min > capacity then
    -- It can never pass; the time to fill an empty bucket is a hint.
    retry = bucket_wait(capacity, 0, now, now, amount, every)
  else
    retry = bucket_wait(min, tokens, last, now, amount, every)
  end
  if retry < 1 then
    retry = 1
  end
end

-- The bucket is full again (and its key expires) in `reset` µs.
local reset = bucket_put(KEYS[1], tokens, last, now, replay, capacity, amount, every)

return {allowed, tokens, reset, retry, granted}
