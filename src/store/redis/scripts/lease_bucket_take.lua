-- tollgate: token bucket, lease take: a slice of tokens out of the bucket for an instance
-- to spend locally (a hot key's lease).
--
-- KEYS[1]  the bucket: hash {t = tokens, l = instant of the last refill}
-- ARGV     capacity, amount, every, want, [at]
--
-- Units and refill rule as in token_bucket.lua (microseconds from Redis TIME or `at`,
-- integers below 2^52). The slice is the largest count the bucket holds up to `want`,
-- g = min(tokens, want), taken at once: tokens are spent before they are used, so the
-- fleet never admits more than capacity + refills. g may be 0 (an empty bucket): the
-- caller then decides exactly. Tokens do not lapse, so the slice has no end (-1).
--
-- Returns {granted, remaining tokens (the shared remainder), epoch (0), valid µs (-1)}.

local capacity = tonumber(ARGV[1])
local amount = tonumber(ARGV[2])
local every = tonumber(ARGV[3])
local want = tonumber(ARGV[4])
local now, replay = clock(ARGV[5])

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
    tokens = capacity
    last = now
  end
else
  tokens = capacity
  last = now
end

local granted = math.min(tokens, want)
tokens = tokens - granted

if tokens >= capacity then
  redis.call('DEL', KEYS[1])
else
  redis.call('HSET', KEYS[1], 't', str(tokens), 'l', str(last))
  -- Expire when full again (see token_bucket.lua).
  local refills = cdiv(capacity - tokens, amount)
  local reset = CAP
  if refills < CAP / every then
    reset = math.max(refills * every - (now - last), 0)
  end
  expire_in(KEYS[1], cdiv(reset, 1000), replay)
end

return {granted, tokens, 0, -1}
