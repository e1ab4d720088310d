-- tollgate: concurrency, take copies from several counters at once, all or nothing.
--
-- KEYS     pairs, one per counter i = 1..N: counts_i (hash {field = copies it holds}),
--          leases_i (sorted set {field = end of its lease, µs})
-- ARGV     field, lease (µs), min, copies, max_1, ..., max_N
--
-- A counter is a concurrency count kept per holder (`field`: an instance and the limiter's
-- incarnation in it), each holder's share living only as long as its lease, which the
-- holder renews (counters_renew.lua): a holder that dies stops renewing, and the first
-- script to run after its lease ended drops its share. Time is Redis TIME in µs.
--
-- The counters are checked in the order given (the caller passes the key's own counter,
-- then the global one, then the groups'), each against its max, before anything is
-- written: the grant is the largest g in [min, copies] that fits every one of them; if one
-- cannot take `min`, nothing is taken and that counter is named. Charon's rule: exact,
-- never wrongly denying. The keys expire with their latest lease.
--
-- Returns {1, granted, remaining (the smallest room left)} or {0, i, copies in use there}.

local me = ARGV[1]
local lease, min, copies = numbers(2, 4)
local now = clock()

if min > copies then
  min = copies
end
local totals, rooms = counter_rooms(4, now)

local want = copies
for i = 1, #rooms do
  if rooms[i] < min then
    return {0, i, totals[i]}
  end
  want = math.min(want, rooms[i])
end

local remaining = nil
for i = 1, #rooms do
  if want > 0 then
    counter_take(KEYS[2 * i - 1], KEYS[2 * i], me, want, lease, now)
  end
  local left = tonumber(ARGV[4 + i]) - totals[i] - want
  remaining = math.min(remaining or left, left)
end
return {1, want, remaining or 0}
