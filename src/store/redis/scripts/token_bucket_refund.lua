-- tollgate: token bucket, refund: gives back tokens taken by an admitted request that a
-- later limit rejected (the no-burn rule).
--
-- KEYS[1]  the bucket: hash {t = tokens, l = instant of the last refill}
-- ARGV     capacity, amount, every, cost, [at]
--
-- Units and refill rule as in token_bucket.lua (microseconds, integers below 2^52). Due
-- refills apply first and the bucket never exceeds capacity; an absent bucket is full, so
-- refunding it changes nothing. Returns the tokens after the refund.

local capacity, amount, every, cost = numbers(1, 4)
local now, replay = clock(ARGV[5])

local tokens, last
tokens, last, now = bucket_load(KEYS[1], now, capacity, amount, every)
tokens = tokens + cost
bucket_put(KEYS[1], tokens, last, now, replay, capacity, amount, every)
return math.min(tokens, capacity)
