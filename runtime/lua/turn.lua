-- Takes, or keeps, a queue's turn at a task that one process at a time does for all of it (the
-- reaping of a sharded queue's shards): the holder's name with a time to live.
-- KEYS[1] <prefix>turn:<task>
-- ARGV[1] holder  ARGV[2] time to live (ms)
-- Returns: 1 when the caller holds the turn now (for that long from now), 0 when another does.
local holder = redis.call('GET', KEYS[1])
if holder and holder ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
