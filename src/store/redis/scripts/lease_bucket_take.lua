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

local capacity, amount, every, want = numbers(1, 4)
local now, replay = clock(ARGV[5])

local tokens, last
tokens, last, now = bucket_load(KEYS[1], now, capacity, amount, every)

local granted = math.min(tokens, want)
tokens = tokens - granted
bucket_put(KEYS[1], tokens, last, now, replay, capacity, amount, every)

return {granted, tokens, 0, -1}
