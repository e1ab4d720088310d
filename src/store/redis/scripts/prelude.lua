-- tollgate: the prelude, prepended to every script of this folder when tollgate is built
-- (scripts.rs): one name for each clock, integer helper and cap the scripts share, so that
-- none declares its own. It only defines; nothing here runs a command.
--
-- Numbers: Lua's are doubles, exact for integers below 2^53. Every count, instant and
-- duration the scripts compute stays an integer below 2^52 (the caller clamps what it
-- sends; TIME in µs is below 2^52 until 2112), which CAP names.

-- 2^52: counts and durations saturate here.
local CAP = 4503599627370496

-- The decision's instant in µs and whether it is a replay's: `at` (an ARGV value, the
-- caller's clock) when given, else Redis TIME, one clock for the fleet.
local function clock(at)
  if at ~= nil then
    return tonumber(at), true
  end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2]), false
end

-- floor(a / b) for integers 0 <= a, 1 <= b, a + b < 2^53: the double quotient is rounded,
-- so the floor may be one off near an integer; one exact product corrects it.
local function fdiv(a, b)
  local q = math.floor(a / b)
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  return q
end

-- ceil(a / b), on the same terms as fdiv.
local function cdiv(a, b)
  return fdiv(a + b - 1, b)
end

-- An integer as Redis reads a number: all its digits, never an exponent.
local function str(x)
  return string.format('%.0f', x)
end

-- Sets `key` to expire in `ms` milliseconds (at least 1); a replay keeps a minute of
-- slack, since its clock need not run with Redis's.
local function expire_in(key, ms, replay)
  if replay then
    ms = ms + 60000
  end
  if ms < 1 then
    ms = 1
  end
  redis.call('PEXPIRE', key, str(ms))
end

-- The member of a decision's `j`-th entry (a sliding log's entry, a tiered hit): `id`,
-- then `id:2`, `id:3` ..., so that a refund names exactly the decision's entries.
local function member(id, j)
  if j == 1 then
    return id
  end
  return id .. ':' .. j
end

-- Leased counts (inflight, concurrency): `counts` is a hash {holder = count}, `leases` a
-- sorted set {holder = end of its lease, µs}. Drops the holders whose lease ended by `now`.
local function drop_ended(counts, leases, now)
  local ended = redis.call('ZRANGEBYSCORE', leases, '-inf', str(now))
  if #ended > 0 then
    redis.call('HDEL', counts, unpack(ended))
    redis.call('ZREMRANGEBYSCORE', leases, '-inf', str(now))
  end
end

-- The sum of a leased count's holders.
local function held_total(counts)
  local total = 0
  local held = redis.call('HVALS', counts)
  for i = 1, #held do
    total = total + tonumber(held[i])
  end
  return total
end

-- Sets both keys of a leased count to expire with its latest lease (if it has one).
local function expire_with_leases(counts, leases, now)
  local last = redis.call('ZRANGE', leases, -1, -1, 'WITHSCORES')
  if last[2] then
    local ttl = math.ceil((tonumber(last[2]) - now) / 1000) + 1
    redis.call('PEXPIRE', counts, str(ttl))
    redis.call('PEXPIRE', leases, str(ttl))
  end
end

-- The script follows.
