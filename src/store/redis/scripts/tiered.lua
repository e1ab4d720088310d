-- tollgate: tiered (Charon's burst tiers), one atomic decision for one key, with exactly
-- the in-process limiter's semantics (src/limits/tiered/; see docs/architecture.md).
--
-- KEYS[1]        state: hash {e<i> = instant tier i was last entered, µs}
-- KEYS[1+i]      tier i's access log, i = 1..n: sorted set {member = hit, score = its
--                instant, µs}; it never holds more than the tier's limit L
-- KEYS[n+2]      the hard limit's log (a 1 s window), when hard > 0
-- KEYS[last]     the global count, when gmode = 1: hash {s = aligned second, c = count}
-- ARGV           id, min, max, n, hard (0: none), glimit, gmode, groom, gturn,
--                then per tier: limit, window, active, cooldown, skippable (0|1), [at]
--
-- Time is Redis TIME in µs, or `at` for a replay. A tier entered at e is active during
-- [e, e + active), cooling during [e + active, e + active + cooldown), inactive otherwise;
-- the current tier is the active tier with the greatest index, or 0. A hit at h is in its
-- window while now < h + window.
--
-- The decision (as the in-process limiter's acquire_many): the hard limit first (fewer
-- than `min` free: rejected), then the burst chain: the current tier, then the tiers
-- above it in order, a cooling tier stopping the burst unless skippable, until the
-- chain's free room covers the request (fewer than `min` free: rejected), then the global
-- limit (fewer than `min` free: rejected). A refusal changes nothing: no tier is entered.
-- Otherwise the grant, the largest count in [min, max] that fits, fills the chain's tiers
-- in order, entering those above the current one, and is logged in the hard log; a grant
-- below `max` says which limit cut it (global, else hard, else the tiers). Hits are members `id`, `id:2` .. (unique to
-- the decision), stored at `now`, or at a log's newest hit if a replay went back, so
-- that each log stays in time order as the in-process ring does.
--
-- The global limit counts admissions per aligned second across all keys. gmode 1: in
-- KEYS[last] (one Redis; see docs/architecture.md for Cluster). gmode 2: decided by the
-- caller, which passes the room it reserved (`groom`) and the µs until its second turns
-- (`gturn`, 0 if nothing is counted). gmode 0: no global limit.
--
-- Retry-After of a rejection: the earliest instant at which `min` copies fit if nothing
-- else happens, searched interval by interval between the instants where a tier's active
-- period or cooldown ends or the global second turns (between two of them each limit's
-- room only grows): the latest of when the hard log has room and when the reachable
-- tiers' logs together have room (a merge of their hits by expiry). A request that never
-- fits gets -1: never. Every key expires
-- when its state equals a new key's: all tiers inactive, every log empty.
--
-- Returns {allowed, granted, tier (current after), decided_by (1 tier window, 2 no tier
-- enterable, 3 hard limit, 4 global limit), first_tier, remaining, reset_after µs,
-- retry_after µs (-1: never), tiers entered (bit i-1 for tier i), now µs}.

local id = ARGV[1]
local min, max, n, hard, glimit, gmode, groom_arg, gturn_arg = numbers(2, 9)
local now, replay = clock(ARGV[10 + 5 * n])

local INF = math.huge
local SEC = 1000000
local TIER_WINDOW, NO_TIER, HARD, GLOBAL = 1, 2, 3, 4

local limit, window, active, cooldown, skippable, logs = {}, {}, {}, {}, {}, {}
for i = 1, n do
  local a = 9 + 5 * (i - 1)
  limit[i] = tonumber(ARGV[a + 1])
  window[i] = tonumber(ARGV[a + 2])
  active[i] = tonumber(ARGV[a + 3])
  cooldown[i] = tonumber(ARGV[a + 4])
  skippable[i] = ARGV[a + 5] == '1'
  logs[i] = KEYS[1 + i]
end
local hard_log = nil
if hard > 0 then
  hard_log = KEYS[n + 2]
end
local gkey = nil
if gmode == 1 then
  gkey = KEYS[#KEYS]
end

if min < 1 then
  min = 1
end
if max < min then
  max = min
end

local entered = {}
do
  local fields = {}
  for i = 1, n do
    fields[i] = 'e' .. i
  end
  local e = redis.call('HMGET', KEYS[1], unpack(fields))
  for i = 1, n do
    entered[i] = tonumber(e[i])
  end
end

-- Global state: the counted second and its count.
local gsec, gcount = 0, 0
if gmode == 1 then
  local g = redis.call('HMGET', gkey, 's', 'c')
  gsec = tonumber(g[1]) or 0
  gcount = tonumber(g[2]) or 0
end

local function later(t, s)
  return math.floor(t / SEC) > s
end

local function groom_at(t)
  if gmode == 0 then
    return INF
  elseif gmode == 1 then
    if later(t, gsec) then
      return glimit
    end
    return math.max(glimit - gcount, 0)
  end
  if gturn_arg > 0 and t >= now + gturn_arg then
    return glimit
  end
  return groom_arg
end

local function gturns_after(t)
  local at = nil
  if gmode == 1 then
    at = (gsec + 1) * SEC
    if gcount == 0 then
      at = nil
    end
  elseif gmode == 2 and gturn_arg > 0 then
    at = now + gturn_arg
  end
  if at and at > t then
    return at
  end
  return nil
end

-- Takes between `lo` and `want` from the global limit at now; returns how many (0 if fewer
-- than `lo` are free).
local function gtake(lo, want)
  if gmode == 0 then
    return want
  end
  local room = groom_at(now)
  if room < lo then
    return 0
  end
  local take = math.min(want, room)
  if gmode == 1 then
    if later(now, gsec) then
      gsec, gcount = math.floor(now / SEC), 0
    end
    gcount = gcount + take
    redis.call('HSET', gkey, 's', str(gsec), 'c', str(gcount))
    local ttl = 2000
    if replay then
      ttl = ttl + 60000
    end
    redis.call('PEXPIRE', gkey, ttl)
  end
  return take
end

local function phase(i, t)
  local e = entered[i]
  if not e then
    return 'I'
  end
  local ends = e + active[i]
  if t < ends then
    return 'A'
  elseif t < ends + cooldown[i] then
    return 'C'
  end
  return 'I'
end

local function current(t)
  for i = n, 1, -1 do
    if phase(i, t) == 'A' then
      return i
    end
  end
  return 0
end

-- Hits of `log` (window `w`) still in their window at t.
local function live(log, w, t)
  return redis.call('ZCOUNT', log, '(' .. str(t - w), '+inf')
end

-- Per log, the hits left after the pop at now, and the newest hit (false: none). Both are
-- read once and kept up to date by push: a decision reads each log at most twice. A newest
-- hit read before a pop may since have expired; every use of it treats an expired newest
-- hit as none.
local cards, lasts = {}, {}

-- Drops the hits of `log` that left their window by now; returns the hits left.
local function pop(log, w)
  if cards[log] == nil then
    redis.call('ZREMRANGEBYSCORE', log, '-inf', str(now - w))
    cards[log] = redis.call('ZCARD', log)
  end
  return cards[log]
end

local function room_now(i)
  return math.max(limit[i] - pop(logs[i], window[i]), 0)
end

local function room_at(i, t)
  return math.max(limit[i] - live(logs[i], window[i], t), 0)
end

-- The tiers a burst from the current tier reaches at t, with room(i), stopping once their
-- room reaches `need`.
local function chain(t, need, room)
  local c = {current = current(t), tiers = {}, rooms = {}, total = 0, ends = TIER_WINDOW}
  local function add(i)
    local r = room(i)
    c.tiers[#c.tiers + 1] = i
    c.rooms[#c.rooms + 1] = r
    c.total = c.total + r
    c.ends = TIER_WINDOW
    return c.total >= need
  end
  if c.current > 0 and add(c.current) then
    return c
  end
  for i = c.current + 1, n do
    local p = phase(i, t)
    if p == 'C' then
      c.ends = NO_TIER
      if not skippable[i] then
        break
      end
    elseif add(i) then
      break
    end
  end
  return c
end

local mask = 0
local function enter(i)
  entered[i] = now
  redis.call('HSET', KEYS[1], 'e' .. i, str(now))
  mask = mask + 2 ^ (i - 1)
end

-- The newest hit of `log`, or nil.
local function newest(log)
  if lasts[log] == nil then
    local last = redis.call('ZRANGE', log, -1, -1, 'WITHSCORES')
    lasts[log] = tonumber(last[2]) or false
  end
  return lasts[log] or nil
end

-- Records `count` hits (members first .. first + count - 1 of the decision) in `log`,
-- which was popped at now.
local function push(log, first, count)
  local at = now
  local last = newest(log)
  if last and last > at then
    at = last
  end
  local batch = {}
  for j = first, first + count - 1 do
    batch[#batch + 1] = str(at)
    batch[#batch + 1] = member(id, j)
    if #batch >= 2000 then
      redis.call('ZADD', log, unpack(batch))
      batch = {}
    end
  end
  if #batch > 0 then
    redis.call('ZADD', log, unpack(batch))
  end
  cards[log] = (cards[log] or 0) + count
  lasts[log] = at
end

-- The first instant from `lo` at which `log` (limit `l`, window `w`) has `want` free.
local function frees_at(log, l, w, lo, want)
  local keep = l - want
  if keep < 0 then
    return nil
  end
  local count = live(log, w, lo)
  if count <= keep then
    return lo
  end
  local hit = redis.call('ZRANGEBYSCORE', log, '(' .. str(lo - w), '+inf', 'WITHSCORES',
    'LIMIT', count - keep - 1, 1)
  return tonumber(hit[2]) + w
end

-- The first instant after t at which a tier's active period or cooldown ends, or the
-- global second turns.
local function next_change(t)
  local next = gturns_after(t) or INF
  for i = 1, n do
    local e = entered[i]
    if e then
      local ends = e + active[i]
      for _, at in ipairs({ends, ends + cooldown[i]}) do
        if at > t and at < next then
          next = at
        end
      end
    end
  end
  return next
end

-- The earliest instant from lo at which `want` copies fit if every tier kept its phase
-- at lo: the latest of the instants at which each limit alone has room.
local function earliest_within(want, lo)
  if groom_at(lo) < want then
    return nil
  end
  local at = lo
  if hard_log then
    local f = frees_at(hard_log, hard, SEC, lo, want)
    if not f then
      return nil
    end
    at = math.max(at, f)
  end
  local c = chain(lo, INF, function(i)
    return room_at(i, lo)
  end)
  if c.total >= want then
    return at
  end
  -- Merge the chain's logs by expiry until `want - total` more hits have left.
  local need = want - c.total
  local expiries = {}
  for k = 1, #c.tiers do
    local i = c.tiers[k]
    local hits = redis.call('ZRANGEBYSCORE', logs[i], '(' .. str(lo - window[i]), '+inf',
      'WITHSCORES', 'LIMIT', 0, need)
    for j = 2, #hits, 2 do
      expiries[#expiries + 1] = tonumber(hits[j]) + window[i]
    end
  end
  if #expiries < need then
    return nil
  end
  table.sort(expiries)
  return math.max(at, expiries[need])
end

local function earliest(want)
  local lo = now
  while true do
    local hi = next_change(lo)
    local at = earliest_within(want, lo)
    if at and at < hi then
      return at
    end
    if hi == INF then
      return nil
    end
    lo = hi
  end
end

-- When the key's state equals a new key's: every tier inactive, every log empty.
local function state_ends()
  local ends = 0
  for i = 1, n do
    if entered[i] then
      ends = math.max(ends, entered[i] + active[i] + cooldown[i])
    end
    local last = newest(logs[i])
    if last then
      ends = math.max(ends, last + window[i])
    end
  end
  if hard_log then
    local last = newest(hard_log)
    if last then
      ends = math.max(ends, last + SEC)
    end
  end
  return ends
end

-- The current tier at now, its free room and the time until its window is empty.
local function headline(tier)
  if tier == 0 then
    return 0, 0
  end
  local room = room_now(tier)
  local reset = 0
  local last = newest(logs[tier])
  if last then
    reset = math.max(last + window[tier] - now, 0)
  end
  return room, reset
end

-- Drops entry times of tiers that are inactive again and sets every key's expiry to the
-- end of the key's state (or deletes it all when that has passed).
local function settle()
  local stale = {}
  for i = 1, n do
    if entered[i] and entered[i] + active[i] + cooldown[i] <= now then
      stale[#stale + 1] = 'e' .. i
    end
  end
  if #stale > 0 then
    redis.call('HDEL', KEYS[1], unpack(stale))
  end
  local ends = state_ends()
  local last = n + 1
  if hard_log then
    last = n + 2
  end
  if ends <= now then
    for k = 1, last do
      redis.call('DEL', KEYS[k])
    end
    return
  end
  for k = 1, last do
    expire_in(KEYS[k], math.ceil((ends - now) / 1000), replay)
  end
end

local function rejected(by)
  local tier = current(now)
  local room, reset = headline(tier)
  local retry = -1
  local at = earliest(min)
  if at then
    retry = math.max(at - now, 1)
  end
  settle()
  return {0, 0, tier, by, 0, room, reset, retry, mask, now}
end

local hard_room = INF
if hard_log then
  hard_room = math.max(hard - pop(hard_log, SEC), 0)
end
if hard_room < min then
  return rejected(HARD)
end

local need = math.min(max, hard_room)
local c = chain(now, need, room_now)
if c.total < min then
  -- A refusal changes nothing: no tier the burst reached is entered.
  return rejected(c.ends)
end

local grant = math.min(need, c.total)
local granted = gtake(min, grant)
if granted < min then
  return rejected(GLOBAL)
end
local by = TIER_WINDOW
if granted < grant then
  by = GLOBAL
elseif grant < max and grant == hard_room then
  by = HARD
end

local left, first_tier, cur, next_hit = granted, 0, c.current, 1
for k = 1, #c.tiers do
  if left == 0 then
    break
  end
  local i = c.tiers[k]
  if i > c.current then
    enter(i)
    cur = i
  end
  local take = math.min(left, c.rooms[k])
  if take > 0 then
    if first_tier == 0 then
      first_tier = i
    end
    push(logs[i], next_hit, take)
    next_hit = next_hit + take
    left = left - take
  end
end
if hard_log then
  push(hard_log, 1, granted)
end

local room, reset = headline(cur)
settle()
return {1, granted, cur, by, first_tier, room, reset, 0, mask, now}
