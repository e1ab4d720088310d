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
local lease = tonumber(ARGV[2])
local min = tonumber(ARGV[3])
local copies = tonumber(ARGV[4])
local now = clock()

if min > copies then
  min = copies
end
local n = #KEYS / 2
local totals = {}
for i = 1, n do
  local counts, leases = KEYS[2 * i - 1], KEYS[2 * i]
  drop_ended(counts, leases, now)
  totals[i] = held_total(counts)
end

local want = copies
for i = 1, n do
  local room = tonumber(ARGV[4 + i]) - totals[i]
  if room < 0 then
    room = 0
  end
  if room < min then
    return {0, i, totals[i]}
  end
  if room < want then
    want = room
  end
end

local remaining = nil
for i = 1, n do
  local counts, leases = KEYS[2 * i - 1], KEYS[2 * i]
  if want > 0 then
    redis.call('HINCRBY', counts, me, want)
    redis.call('ZADD', leases, str(now + lease), me)
    expire_with_leases(counts, leases, now)
  end
  local left = tonumber(ARGV[4 + i]) - totals[i] - want
  if remaining == nil or left < remaining then
    remaining = left
  end
end
return {1, want, remaining or 0}
