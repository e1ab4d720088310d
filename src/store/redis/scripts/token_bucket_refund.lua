-- tollgate: token bucket, refund: gives back tokens taken by an admitted request that a
-- later limit rejected (the no-burn rule).
--
-- KEYS[1]  the bucket: hash {t = tokens, l = instant of the last refill}
-- ARGV     capacity, amount, every, cost, [at]
--
-- Units and refill rule as in token_bucket.lua (microseconds, integers below 2^52). Due
-- refills apply first and the bucket never exceeds capacity; an absent bucket is full, so
-- refunding it changes nothing. Returns the tokens after the refund.

local capacity = tonumber(ARGV[1])
local amount = tonumber(ARGV[2])
local every = tonumber(ARGV[3])
local cost = tonumber(ARGV[4])
local now, replay = clock(ARGV[5])

local state = redis.call('HMGET', KEYS[1], 't', 'l')
if not (state[1] and state[2]) then
  return capacity
end
local tokens = tonumber(state[1])
local last = tonumber(state[2])
if now - last >= every then
  local due = fdiv(now - last, every)
  if tokens >= capacity or due >= cdiv(capacity - tokens, amount) then
    tokens = capacity
  else
    tokens = tokens + due * amount
    last = last + due * every
  end
end
tokens = tokens + cost
if tokens >= capacity then
  redis.call('DEL', KEYS[1])
  return capacity
end

redis.call('HSET', KEYS[1], 't', str(tokens), 'l', str(last))
local refills = cdiv(capacity - tokens, amount)
local ttl = CAP
if refills < CAP / every then
  local elapsed = now - last
  if elapsed < 0 then
    elapsed = 0
  end
  ttl = refills * every - elapsed
end
expire_in(KEYS[1], cdiv(math.max(ttl, 0), 1000), replay)
return tokens
