-- tollgate: sliding log, read only: each window's count of the key's log now, recording
-- nothing.
--
-- KEYS[1]  the log: sorted set {member = entry, score = its instant in µs}
-- ARGV     n, per_1, ..., per_n
--
-- Time is Redis TIME in µs. An entry at t counts in a window of `per` while t > now - per,
-- exactly as sliding_log.lua counts it (entries it would prune first are outside every
-- window anyway). Returns {count_1, ..., count_n}. Writes nothing.

local n = tonumber(ARGV[1])
local now = clock()
local counts = {}
for i = 1, n do
  local per = tonumber(ARGV[1 + i])
  counts[i] = redis.call('ZCOUNT', KEYS[1], '(' .. str(now - per), '+inf')
end
return counts
