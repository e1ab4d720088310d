-- tollgate: sliding log, refund: removes exactly the entries one admission recorded (a
-- later limit rejected the request).
--
-- KEYS[1]  the log: sorted set {member = entry, score = its instant in µs}
-- ARGV     id, count, longest (µs), [at]
--
-- The admission's entries are the members `id`, `id:2` .. `id:count` (see
-- sliding_log.lua); entries already pruned, or refunded, are simply not found. The key then
-- expires when its newest remaining entry leaves the longest window. Returns how many
-- entries were removed.

local id = ARGV[1]
local count = tonumber(ARGV[2])
local longest = tonumber(ARGV[3])
local now, replay = clock(ARGV[4])

local removed = 0
local batch = {}
for j = 1, count do
  batch[#batch + 1] = member(id, j)
  if #batch >= 2000 then
    removed = removed + redis.call('ZREM', KEYS[1], unpack(batch))
    batch = {}
  end
end
if #batch > 0 then
  removed = removed + redis.call('ZREM', KEYS[1], unpack(batch))
end

local newest = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
if newest[2] then
  expire_in(KEYS[1], math.ceil((tonumber(newest[2]) + longest - now) / 1000), replay)
end
return removed
