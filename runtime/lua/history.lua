-- A queue's history, a point a minute (its counters at the minute's start), kept for a day.
-- KEYS[1] <prefix>history (zset: '<minute ms>|<counts JSON>' scored by the minute's start, ms)
-- KEYS[2] <prefix>history:claim (string: the last minute a process took to record)
-- ARGV[1] 'claim': returns 1 to the first caller in this minute (the server's clock) while the
--   minute has no point, else 0: one process a minute counts the queue.
-- ARGV[1] 'put', ARGV[2] the counts (JSON): stores them as this minute's point unless it has
--   one, and removes the points older than a day. Returns 1 when it stored.
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local minute = string.format('%d', now - now % 60000)
if #redis.call('ZRANGE', KEYS[1], minute, minute, 'BYSCORE', 'LIMIT', 0, 1) > 0 then return 0 end
if ARGV[1] == 'claim' then
  if redis.call('GET', KEYS[2]) == minute then return 0 end
  redis.call('SET', KEYS[2], minute, 'PX', 120000)
  return 1
end
redis.call('ZADD', KEYS[1], minute, minute .. '|' .. ARGV[2])
-- (At most one point a minute is added, so this removes about one, and a day's at most.)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('(%d', now - now % 60000 - 86400000))
return 1
