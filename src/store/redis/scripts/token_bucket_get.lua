-- tollgate: token bucket, read only (RL.GET): the tokens a bucket holds now, taking nothing.
--
-- KEYS[1]  the bucket: hash {t = tokens, l = instant of the last refill}
-- ARGV     capacity, amount, every, [at]
--
-- Units and refill rule as in token_bucket.lua (microseconds, integers below 2^52).
-- Returns {tokens, reset_after µs}. Writes nothing.

local capacity, amount, every = numbers(1, 3)
local now = clock(ARGV[4])

local tokens, last
tokens, last, now = bucket_load(KEYS[1], now, capacity, amount, every)
return {tokens, bucket_wait(capacity, tokens, last, now, amount, every)}
