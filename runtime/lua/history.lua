-- A queue's history, a point a minute (the counts at the minute's start), kept for a day.
-- KEYS[1] <prefix>history (zset: '<minute ms>|<counts JSON>' scored by the minute's start, ms)
-- ARGV[1] 'due': returns 1 when this minute (the server's clock) has no point yet, else 0.
-- ARGV[1] 'put', ARGV[2] the counts (JSON): stores them as this minute's point unless it has
--   one, and removes the points older than a day. Returns 1 when it stored.
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local minute = string.format('%d', now - now % 60000)
if #redis.call('ZRANGE', KEYS[1], minute, minute, 'BYSCORE', 'LIMIT', 0, 1) > 0 then return 0 end
if ARGV[1] == 'due' then return 1 end
redis.call('ZADD', KEYS[1], minute, minute .. '|' .. ARGV[2])
-- (At most one point a minute is added, so this removes about one, and a day's at most.)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('(%d', now - now % 60000 - 86400000))
return 1
