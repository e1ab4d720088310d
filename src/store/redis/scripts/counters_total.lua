-- tollgate: concurrency, read only: the copies each counter holds across the fleet,
-- counting only holders whose lease has not ended, taking and dropping nothing.
--
-- KEYS     pairs, one per counter i = 1..N: counts_i (hash {field = copies it holds}),
--          leases_i (sorted set {field = end of its lease, µs})
--
-- Time is Redis TIME in µs. A holder counts exactly as counters_acquire.lua counts it: that
-- script drops every holder whose lease ended (score <= now) and sums the rest of the hash,
-- so here a field is summed unless its lease score is <= now. Returns {total_1, ...,
-- total_N}. Writes nothing.

local now = clock()
local n = #KEYS / 2
local totals = {}
for i = 1, n do
  local counts, leases = KEYS[2 * i - 1], KEYS[2 * i]
  local held = redis.call('HGETALL', counts)
  local total = 0
  for j = 1, #held, 2 do
    local ends = redis.call('ZSCORE', leases, held[j])
    if not ends or tonumber(ends) > now then
      total = total + tonumber(held[j + 1])
    end
  end
  totals[i] = total
end
return totals
