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

local capacity = tonumber(ARGV[1])
local amount = tonumber(ARGV[2])
local every = tonumber(ARGV[3])
local cost = tonumber(ARGV[4])
local strict = ARGV[5] == '1'
local min = tonumber(ARGV[6])
local now, replay = clock(ARGV[7])

local tokens, last
local state = redis.call('HMGET', KEYS[1], 't', 'l')
if state[1] and state[2] then
  tokens = tonumber(state[1])
  last = tonumber(state[2])
  if now < last then
    now = last
  end
  if now - last >= every then
    local due = fdiv(now - last, every)
    if tokens >= capacity or due >= cdiv(capacity - tokens, amount) then
      tokens = capacity
      last = now
    else
      tokens = tokens + due * amount
      last = last + due * every
    end
  end
  if tokens >= capacity then
    -- Stored with a larger capacity (the limit was changed): full.
    tokens = capacity
    last = now
  end
else
  tokens = capacity
  last = now
end

local allowed = 0
local granted = 0
if tokens >= min then
  granted = math.min(tokens, cost)
  tokens = tokens - granted
  allowed = 1
elseif strict then
  last = now
end

-- Microseconds from now until the refill that brings the bucket to `want` tokens.
local function wait_for(want)
  if want <= tokens then
    return 0
  end
  local refills = cdiv(want - tokens, amount)
  if refills >= CAP / every then
    return CAP
  end
  local elapsed = now - last
  if elapsed < 0 then
    elapsed = 0
  end
  local wait = refills * every - elapsed
  if wait < 0 then
    wait = 0
  end
  return wait
end

local reset = wait_for(capacity)
local retry = 0
if allowed == 0 then
  if min > capacity then
    -- It can never pass; the time to fill an empty bucket is a hint.
    local full = cdiv(capacity, amount)
    if full >= CAP / every then
      retry = CAP
    else
      retry = full * every
    end
  else
    retry = wait_for(min)
  end
  if retry < 1 then
    retry = 1
  end
end

if tokens >= capacity then
  redis.call('DEL', KEYS[1])
else
  redis.call('HSET', KEYS[1], 't', str(tokens), 'l', str(last))
  -- Expire when full again, in whole milliseconds rounded up.
  expire_in(KEYS[1], cdiv(reset, 1000), replay)
end

return {allowed, tokens, reset, retry, granted}
