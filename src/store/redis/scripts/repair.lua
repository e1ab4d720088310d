-- tollgate: repairs the keys of a decision that failed on their data (a WRONGTYPE answer,
-- or a script error reading them): each key that is not what tollgate writes there is
-- deleted, so that the next decision starts from an absent key, which every script reads
-- as a new one. Keys that are what tollgate writes are left alone.
--
-- KEYS     the keys the failed call named (one Cluster slot, as the call's)
-- ARGV[i]  the type KEYS[i] must have: 'hash' or 'zset', '' to leave it alone
--
-- A key is not what tollgate writes when it is of another type, when it is a hash with a
-- field that is not a finite number (every hash tollgate writes holds numbers only), or
-- a sorted set whose lowest or highest score is infinite (scores are instants).
--
-- Returns the names of the keys deleted.

local function finite(x)
  local n = tonumber(x)
  return n ~= nil and n == n and n ~= math.huge and n ~= -math.huge
end

local deleted = {}
for i, key in ipairs(KEYS) do
  local want = ARGV[i] or ''
  local have = redis.call('TYPE', key)['ok']
  if want ~= '' and have ~= 'none' then
    local bad = have ~= want
    if not bad and have == 'hash' then
      local fields = redis.call('HGETALL', key)
      for j = 2, #fields, 2 do
        if not finite(fields[j]) then
          bad = true
          break
        end
      end
    elseif not bad and have == 'zset' then
      for _, at in ipairs({0, -1}) do
        local hit = redis.call('ZRANGE', key, at, at, 'WITHSCORES')
        if hit[2] and not finite(hit[2]) then
          bad = true
        end
      end
    end
    if bad then
      redis.call('DEL', key)
      deleted[#deleted + 1] = key
    end
  end
end
return deleted
