-- tollgate: concurrency and inflight, lease take: a block of slots for a holder to hand
-- out locally, from several counters at once.
--
-- KEYS     pairs, one per counter i = 1..N: counts_i (hash {field = slots it holds}),
--          leases_i (sorted set {field = end of its lease, µs}); see counters_acquire.lua
-- ARGV     field, lease (µs), want, max_1, ..., max_N
--
-- The counters are those of counters_acquire.lua and inflight_acquire.lua, so holders
-- deciding exactly and holders leasing blocks share them; a leasing holder uses a field of
-- its own. Holders whose lease ended are dropped first. The block is the largest
-- g <= want that every counter has room for (total_i + g <= max_i), taken from all of
-- them at once; g may be 0 (then nothing is written but the holder's lease, if it holds
-- slots, is extended). The holder renews its lease (counters_renew.lua) and gives slots
-- back (counters_release.lua); one that dies loses them after one lease. Time is Redis
-- TIME in µs.
--
-- Returns {granted, remaining (the smallest room left), epoch (0), valid µs (the lease)}.

local me = ARGV[1]
local lease = tonumber(ARGV[2])
local want = tonumber(ARGV[3])
local now = clock()

local n = #KEYS / 2
local rooms = {}
local granted = want
for i = 1, n do
  local counts, leases = KEYS[2 * i - 1], KEYS[2 * i]
  drop_ended(counts, leases, now)
  local total = held_total(counts)
  local room = math.max(tonumber(ARGV[3 + i]) - total, 0)
  rooms[i] = room
  if room < granted then
    granted = room
  end
end

local remaining = nil
for i = 1, n do
  local counts, leases = KEYS[2 * i - 1], KEYS[2 * i]
  if granted > 0 then
    redis.call('HINCRBY', counts, me, granted)
  end
  if granted > 0 or redis.call('HEXISTS', counts, me) == 1 then
    redis.call('ZADD', leases, str(now + lease), me)
    expire_with_leases(counts, leases, now)
  end
  local left = rooms[i] - granted
  if remaining == nil or left < remaining then
    remaining = left
  end
end
return {granted, remaining or 0, 0, lease}
