-- tollgate: token bucket, read only (RL.GET): the tokens a bucket holds now, taking nothing.
--
-- KEYS[1]  the bucket: hash {t = tokens, l = instant of the last refill}
-- ARGV     capacity, amount, every, [at]
--
-- Units and refill rule as in token_bucket.lua (microseconds, integers below 2^52).
-- Returns {tokens, reset_after µs}. Writes nothing.

local capacity = tonumber(ARGV[1])
local amount = tonumber(ARGV[2])
local every = tonumber(ARGV[3])
local now = clock(ARGV[4])

local state = redis.call('HMGET', KEYS[1], 't', 'l')
if not (state[1] and state[2]) then
  return {capacity, 0}
end
local tokens = tonumber(state[1])
local last = tonumber(state[2])
if now - last >= every then
  local due = fdiv(now - last, every)
  if tokens >= capacity or due >= cdiv(capacity - tokens, amount) then
    return {capacity, 0}
  end
  tokens = tokens + due * amount
  last = last + due * every
end
if tokens >= capacity then
  return {capacity, 0}
end

local refills = cdiv(capacity - tokens, amount)
local reset
if refills >= CAP / every then
  reset = CAP
else
  local elapsed = now - last
  if elapsed < 0 then
    elapsed = 0
  end
  reset = refills * every - elapsed
  if reset < 0 then
    reset = 0
  end
end
return {tokens, reset}
