-- tollgate: concurrency and inflight, lease take: a block of slots for a holder to hand
-- out locally, from several counters at once.
--
-- KEYS     pairs, one per counter i = 1..N: counts_i (hash {field = slots it holds}),
--          leases_i (sorted set {field = end of its lease, µs}); see counters_acquire.lua
-- ARGV     field, lease (µs), want, max_1, ..., max_N
--
-- The counters are those of counters_acquire.lua (concurrency and inflight), so holders
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

local _, rooms = counter_rooms(3, now)
-- The smallest room (nil without counters).
local least = nil
for i = 1, #rooms do
  least = math.min(least or rooms[i], rooms[i])
end

local granted = math.min(want, least or want)
for i = 1, #rooms do
  counter_take(KEYS[2 * i - 1], KEYS[2 * i], me, granted, lease, now)
end
return {granted, least and least - granted or 0, 0, lease}
