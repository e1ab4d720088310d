-- tollgate: sliding log, acquire (Grab's frequency caps): one exact decision over every
-- window of the key's log at once.
--
-- KEYS[1]  the log: sorted set {member = entry, score = its instant in µs}
-- ARGV     id, min, cost, n, max_1, per_1, ..., max_n, per_n, [at]
--
-- Time is Redis TIME in µs, or `at` for a replay. An entry at t counts in a window of `per`
-- while now < t + per, i.e. t > now - per (entries after `now`, from a replay going back,
-- count too: the strict side). Entries that left the longest window are pruned first
-- (ZREMRANGEBYSCORE), then each window is counted (ZCOUNT).
--
-- The grant is the largest g in [min, cost] with count_i + g <= max_i in every window; if
-- even `min` does not fit, nothing is recorded (the proxy passes min = cost). A grant of g
-- records g entries at `now`: members `id` and `id:2` .. `id:g`, `id` being unique to the
-- decision, so that a refund removes exactly them (sliding_log_refund.lua).
--
-- Retry-After of a rejection: for each window short of room for `min`, the instant its
-- (count + min - max)-th oldest live entry leaves it; the latest of those. A window whose
-- max is below `min` never has room: its `per` is returned as a hint (the caller says
-- "never"). reset_after is the time until the log is empty (its newest entry leaves the
-- longest window), and the key expires then.
--
-- Returns {allowed (0|1), granted, remaining (the smallest room left), reset_after µs,
-- retry_after µs}.

local id = ARGV[1]
local min, cost, n = numbers(2, 4)
local now, replay = clock(ARGV[5 + 2 * n])

local maxes, pers = {}, {}
local longest = 1
for i = 1, n do
  maxes[i] = tonumber(ARGV[3 + 2 * i])
  pers[i] = tonumber(ARGV[4 + 2 * i])
  if pers[i] > longest then
    longest = pers[i]
  end
end
if min > cost then
  min = cost
end

redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', str(now - longest))

local counts = {}
local room = nil
for i = 1, n do
  counts[i] = redis.call('ZCOUNT', KEYS[1], '(' .. str(now - pers[i]), '+inf')
  local r = maxes[i] - counts[i]
  if r < 0 then
    r = 0
  end
  if room == nil or r < room then
    room = r
  end
end
room = room or 0

local granted = math.min(cost, room)
local allowed = 0
if granted >= min then
  allowed = 1
else
  granted = 0
end

if granted > 0 then
  local batch = {}
  for j = 1, granted do
    batch[#batch + 1] = str(now)
    batch[#batch + 1] = member(id, j)
    if #batch >= 2000 then
      redis.call('ZADD', KEYS[1], unpack(batch))
      batch = {}
    end
  end
  if #batch > 0 then
    redis.call('ZADD', KEYS[1], unpack(batch))
  end
end

local reset = 0
local newest = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
if newest[2] then
  reset = tonumber(newest[2]) + longest - now
  if reset < 0 then
    reset = 0
  end
  expire_in(KEYS[1], math.ceil(reset / 1000), replay)
end

local retry = 0
if allowed == 0 then
  local ready = now
  local never = 0
  for i = 1, n do
    if counts[i] + min > maxes[i] then
      if min > maxes[i] then
        if pers[i] > never then
          never = pers[i]
        end
      else
        -- 1 <= k <= count, as min <= max < count + min.
        local k = counts[i] + min - maxes[i]
        local e = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. str(now - pers[i]), '+inf',
          'WITHSCORES', 'LIMIT', k - 1, 1)
        local free = tonumber(e[2]) + pers[i]
        if free > ready then
          ready = free
        end
      end
    end
  end
  if never > 0 then
    retry = never
  else
    retry = ready - now
  end
  if retry < 1 then
    retry = 1
  end
end

return {allowed, granted, room - granted, reset, retry}
