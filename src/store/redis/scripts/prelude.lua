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

-- ARGV[first] .. ARGV[last] as numbers, one value each (nil where one is not a number).
local function numbers(first, last)
  local out = {}
  for i = first, last do
    out[i - first + 1] = tonumber(ARGV[i])
  end
  return unpack(out, 1, last - first + 1)
end

-- A bucket's or a rate's decision (token_bucket.lua, rate.lua, fixed_window.lua): its three
-- parameters and `cost` (ARGV[1..4]), strict (ARGV[5]), `min` (ARGV[6]), then the clock
-- of ARGV[7] (now, replay).
local function request_args()
  local a, b, c, cost = numbers(1, 4)
  return a, b, c, cost, ARGV[5] == '1', tonumber(ARGV[6]), clock(ARGV[7])
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

-- Token bucket (a hash {t = tokens, l = instant of the last refill}): n = floor((now -
-- last) / every) refills are due; tokens = min(capacity, tokens + n * amount), last +=
-- n * every, and last = now once full. Returns the tokens and last after the refills.
local function bucket_refill(tokens, last, now, capacity, amount, every)
  if now - last < every then
    return tokens, last
  end
  local due = fdiv(now - last, every)
  if tokens >= capacity or due >= cdiv(capacity - tokens, amount) then
    return capacity, now
  end
  return tokens + due * amount, last + due * every
end

-- A bucket as a decision reads it: refilled to `now`, which is first moved up to the last
-- refill (a replay going back, another node's clock: time never goes backwards within a
-- bucket). An absent bucket is full, and so is one stored with a larger capacity (the
-- limit was changed). Returns tokens, last, now.
local function bucket_load(key, now, capacity, amount, every)
  local state = redis.call('HMGET', key, 't', 'l')
  if not (state[1] and state[2]) then
    return capacity, now, now
  end
  local last = tonumber(state[2])
  if now < last then
    now = last
  end
  local tokens
  tokens, last = bucket_refill(tonumber(state[1]), last, now, capacity, amount, every)
  if tokens >= capacity then
    return capacity, now, now
  end
  return tokens, last, now
end

-- µs from `now` until the refill that brings a bucket holding `tokens` (last refill at
-- `last`) to `want`: 0 when it holds them, CAP when that is 2^52 µs or more away.
local function bucket_wait(want, tokens, last, now, amount, every)
  if want <= tokens then
    return 0
  end
  local refills = cdiv(want - tokens, amount)
  if refills >= CAP / every then
    return CAP
  end
  return math.max(refills * every - math.max(now - last, 0), 0)
end

-- Writes a bucket back: a full one equals an absent one and is deleted; otherwise it
-- expires when full again, in whole milliseconds rounded up. Returns that wait (µs).
local function bucket_put(key, tokens, last, now, replay, capacity, amount, every)
  if tokens >= capacity then
    redis.call('DEL', key)
    return 0
  end
  redis.call('HSET', key, 't', str(tokens), 'l', str(last))
  local reset = bucket_wait(capacity, tokens, last, now, amount, every)
  expire_in(key, cdiv(reset, 1000), replay)
  return reset
end

-- Sliding-window rate (a hash {p = current period, c = its count, q = the previous
-- period's}): time in ticks of `tick` µs, period p covers ticks [p*per, (p+1)*per), and
-- e ticks of the current one have elapsed. A stored period ahead of this clock (a replay
-- going back, another node's clock) is read at its start: period = the stored one, e = 0,
-- as the in-process limiter counts. An absent window is empty. Returns period, e, prev,
-- curr.
local function window_load(key, now, tick, per)
  local t = fdiv(now, tick)
  local period = fdiv(t, per)
  local e = t - period * per
  local prev, curr = 0, 0
  local state = redis.call('HMGET', key, 'p', 'c', 'q')
  if state[1] then
    local sp = tonumber(state[1])
    local sc = tonumber(state[2]) or 0
    local sq = tonumber(state[3]) or 0
    if sp == period then
      curr, prev = sc, sq
    elseif sp == period - 1 then
      prev = sc
    elseif sp > period then
      period, e, curr, prev = sp, 0, sc, sq
    end
  end
  return period, e, prev, curr
end

-- floor(max - estimate) for the count c, at least 0, where the estimate is
-- prev * (per - e) / per + c: (max - c) * per <= 2^52 is never exceeded, and the product
-- prev * (per - e) is formed only once it is known to be at most that.
local function window_room(c, max, per, e, prev)
  if c > max then
    return 0
  end
  local room = (max - c) * per
  if prev == 0 then
    return max - c
  elseif per - e <= fdiv(room, prev) then
    return fdiv(room - prev * (per - e), per)
  end
  return 0
end

-- Writes a window back: an empty one is deleted. With `tick` (an acquire), the key
-- expires when its estimate reaches 0: at the end of the next period if curr > 0, of this
-- one if only prev > 0. Without (a refund or return, which only lowers the counts), it
-- keeps the expiry the last acquire set.
local function window_put(key, period, prev, curr, per, tick, now, replay)
  if curr == 0 and prev == 0 then
    redis.call('DEL', key)
    return
  end
  redis.call('HSET', key, 'p', str(period), 'c', str(curr), 'q', str(prev))
  if tick then
    local ends = period + 1
    if curr > 0 then
      ends = period + 2
    end
    expire_in(key, cdiv(math.max(ends * per * tick - now, 1), 1000), replay)
  end
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

-- Leased counters given as KEYS pairs (counts_i, leases_i), i = 1..#KEYS/2, with max_i in
-- ARGV[first + i]: drops the holders whose lease ended, then returns each counter's
-- total and its room, max_i - total_i at least 0 (two lists).
local function counter_rooms(first, now)
  local totals, rooms = {}, {}
  for i = 1, #KEYS / 2 do
    local counts, leases = KEYS[2 * i - 1], KEYS[2 * i]
    drop_ended(counts, leases, now)
    totals[i] = held_total(counts)
    rooms[i] = math.max(tonumber(ARGV[first + i]) - totals[i], 0)
  end
  return totals, rooms
end

-- Counts `g` more for holder `me` in a leased count (if g > 0), and when it then holds
-- some, extends its lease to now + lease and the keys' expiry with it.
local function counter_take(counts, leases, me, g, lease, now)
  if g > 0 then
    redis.call('HINCRBY', counts, me, g)
  elseif redis.call('HEXISTS', counts, me) == 0 then
    return
  end
  redis.call('ZADD', leases, str(now + lease), me)
  expire_with_leases(counts, leases, now)
end

-- The script follows.
