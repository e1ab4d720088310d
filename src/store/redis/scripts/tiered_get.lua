-- tollgate: tiered (Charon's burst tiers), read only: the key's current tier, each tier's
-- phase and window count, and how many single requests would pass now, deciding nothing.
--
-- KEYS[1]        state: hash {e<i> = instant tier i was last entered, µs}
-- KEYS[1+i]      tier i's access log, i = 1..n: sorted set {member = hit, score = instant}
-- KEYS[n+2]      the hard limit's log (a 1 s window), when hard > 0
-- KEYS[last]     the global count, when gmode = 1: hash {s = aligned second, c = count}
-- ARGV           n, hard (0: none), glimit, gmode (0|1),
--                then per tier: limit, window, active, cooldown, skippable (0|1)
--
-- Time is Redis TIME in µs. Phases, the current tier, the windows and the burst chain are
-- read exactly as tiered.lua reads them (a hit at h counts while now < h + window; a tier
-- entered at e is active in [e, e + active), cooling for `cooldown` after). `available` is
-- the least of the hard limit's room, the room of the tiers a burst from the current tier
-- reaches (stopping at a cooling tier unless skippable) and the global limit's room, as the
-- in-process limiter's `available`.
--
-- Returns {current, available, hard count (-1: no hard limit), global room (-1: none),
-- then per tier: count, phase (0 inactive, 1 active, 2 cooling)}. Writes nothing.

local n, hard, glimit, gmode = numbers(1, 4)
local now = clock()
local SEC = 1000000

local function live(log, w)
  return redis.call('ZCOUNT', log, '(' .. str(now - w), '+inf')
end

local fields = {}
for i = 1, n do
  fields[i] = 'e' .. i
end
local e = redis.call('HMGET', KEYS[1], unpack(fields))

local counts, phases, rooms = {}, {}, {}
local current = 0
for i = 1, n do
  local a = 4 + 5 * (i - 1)
  local limit = tonumber(ARGV[a + 1])
  local window = tonumber(ARGV[a + 2])
  local active = tonumber(ARGV[a + 3])
  local cooldown = tonumber(ARGV[a + 4])
  local entered = tonumber(e[i])
  local phase = 0
  if entered then
    if now < entered + active then
      phase = 1
    elseif now < entered + active + cooldown then
      phase = 2
    end
  end
  if phase == 1 then
    current = i
  end
  counts[i] = live(KEYS[1 + i], window)
  phases[i] = phase
  rooms[i] = math.max(limit - counts[i], 0)
end

-- The burst chain from the current tier, with no need to stop early.
local chain = 0
if current > 0 then
  chain = rooms[current]
end
for i = current + 1, n do
  if phases[i] == 2 then
    if ARGV[4 + 5 * (i - 1) + 5] ~= '1' then
      break
    end
  else
    chain = chain + rooms[i]
  end
end
local available = chain

local hard_count = -1
if hard > 0 then
  hard_count = live(KEYS[n + 2], SEC)
  available = math.min(available, math.max(hard - hard_count, 0))
end

local groom = -1
if gmode == 1 then
  local g = redis.call('HMGET', KEYS[#KEYS], 's', 'c')
  local gsec = tonumber(g[1]) or 0
  local gcount = tonumber(g[2]) or 0
  if math.floor(now / SEC) > gsec then
    groom = glimit
  else
    groom = math.max(glimit - gcount, 0)
  end
  available = math.min(available, groom)
end

local out = {current, available, hard_count, groom}
for i = 1, n do
  out[#out + 1] = counts[i]
  out[#out + 1] = phases[i]
end
return out
