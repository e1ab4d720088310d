-- tollgate: tiered, refund: takes back exactly the hits one admission recorded (a later
-- limit rejected the request). The tiers it entered stay entered, as in the in-process
-- limiter: the burst happened, and undoing it could reopen a tier another request relied
-- on.
--
-- KEYS           as tiered.lua: state, the n tier logs, [the hard log], [the global count]
-- ARGV           id, granted, first_tier, tier, n, hard (0|1), gmode, decided_at (µs), [at]
--
-- The admission's hits are the members `id`, `id:2` .. `id:granted`, in the logs of tiers
-- first_tier..tier and in the hard log (see tiered.lua); hits already gone are not found.
-- With gmode 1 the global count gives back `granted` if the admission's second is still
-- the one counted. Expiries are left as they are (a refund only empties). Returns the hits
-- removed from the tier logs.

local id = ARGV[1]
local granted, first_tier, tier, n = numbers(2, 5)
local hard = ARGV[6] == '1'
local gmode = tonumber(ARGV[7])
local decided = tonumber(ARGV[8])
local now = clock(ARGV[9])

local members = {}
for j = 1, granted do
  members[j] = member(id, j)
end

local function remove(key)
  local removed = 0
  for from = 1, #members, 2000 do
    local to = math.min(from + 1999, #members)
    removed = removed + redis.call('ZREM', key, unpack(members, from, to))
  end
  return removed
end

local removed = 0
if granted > 0 then
  for i = math.max(first_tier, 1), math.min(tier, n) do
    removed = removed + remove(KEYS[1 + i])
  end
  if hard then
    remove(KEYS[n + 2])
  end
end

if gmode == 1 and granted > 0 then
  local gkey = KEYS[#KEYS]
  local second = math.floor(decided / 1000000)
  if math.floor(now / 1000000) == second then
    local g = redis.call('HMGET', gkey, 's', 'c')
    local s, c = tonumber(g[1]), tonumber(g[2]) or 0
    if s == second and c > 0 then
      redis.call('HSET', gkey, 'c', str(c - math.min(c, granted)))
    end
  end
end
return removed
