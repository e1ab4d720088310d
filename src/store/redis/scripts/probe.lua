-- tollgate: the breaker's probe: proves that scripts run and may write (a node out of
-- memory, or a replica after a failover, fails here before decisions are sent to it).
--
-- KEYS[1]  a probe key, overwritten and expiring after a minute
-- ARGV     the instance name
--
-- Returns Redis TIME in µs.

redis.call('SET', KEYS[1], ARGV[1], 'PX', 60000)
local now = clock()
return now
